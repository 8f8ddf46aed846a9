"""How ``image convert`` talks to a registry, the way skopeo and podman users expect:
credentials (``--creds``, ``--authfile``, else the standard auth files), TLS verification,
the platform picked from a multi-platform index, and whether the converted tree is
announced next to its source (the referrer).

Credentials never reach a command line (``ps`` shows those to every user): ``--creds`` is
written to a private auth file that skopeo reads, removed with the convert's state."""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from bootseer.errors import UsageError

# skopeo transports passed through as typed; anything else that is not a file or a
# directory is a registry reference (docker://)
TRANSPORTS = ("docker://", "docker-archive:", "oci-archive:", "oci:", "containers-storage:",
              "dir:", "docker-daemon:")

_PLATFORM = re.compile(r"([a-z0-9]+)/([a-z0-9_]+)(?:/([a-z0-9]+))?")


def parse_platform(text: str) -> tuple[str, str, str | None]:
    """``os/arch[/variant]`` -> (os, arch, variant), as podman's ``--platform`` spells it."""
    m = _PLATFORM.fullmatch(text.strip().lower())
    if not m:
        raise UsageError(f"--platform {text!r}: expected os/arch[/variant], e.g. linux/amd64 "
                         f"or linux/arm64")
    return m.group(1), m.group(2), m.group(3)


def parse_creds(text: str) -> tuple[str, str]:
    user, sep, password = text.partition(":")
    if not sep or not user:
        # skopeo would prompt for the password; a convert in a pipeline cannot answer
        raise UsageError("--creds expects USER:PASSWORD (the password may be a token)")
    return user, password


def standard_authfiles() -> list[Path]:
    """Where podman, skopeo and docker keep registry logins, in the order they look."""
    env = os.environ
    out = []
    if env.get("REGISTRY_AUTH_FILE"):
        out.append(Path(env["REGISTRY_AUTH_FILE"]))
    if env.get("XDG_RUNTIME_DIR"):
        out.append(Path(env["XDG_RUNTIME_DIR"]) / "containers/auth.json")
    home = Path(env.get("HOME") or Path.home())
    out.append(home / ".config/containers/auth.json")
    out.append(Path(env["DOCKER_CONFIG"]) / "config.json" if env.get("DOCKER_CONFIG")
               else home / ".docker/config.json")
    return out


def login_in(authfile: Path, host: str) -> tuple[str, str] | None:
    """The (user, password) an auth file holds for ``host``, or None (no file, no entry,
    or a credential helper that only the container tools run)."""
    try:
        auths = json.loads(Path(authfile).read_text()).get("auths") or {}
    except (OSError, ValueError, AttributeError):
        return None
    for key in (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/"):
        entry = auths.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("auth"), str):
            try:
                user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return (user, password) if sep else None
    return None


@dataclass(frozen=True)
class RegistryOptions:
    """What a convert from a registry may use; the defaults are what a bare
    ``bootseer image convert REF`` does."""

    authfile: str | None = None
    creds: str | None = field(default=None, repr=False)
    """``USER:PASSWORD`` (never logged, never on a command line)."""
    tls_verify: bool | None = None
    """None: verify, except for a registry on loopback (test and local registries)."""
    platform: str = "linux/amd64"
    referrer: bool = True
    """Announce the converted tree in the source repository (an OCI referrer)."""

    def __post_init__(self):
        parse_platform(self.platform)
        if self.creds is not None:
            parse_creds(self.creds)
        if self.authfile is not None and not Path(self.authfile).is_file():
            raise UsageError(f"--authfile {self.authfile}: no such file")

    def skopeo_global_args(self) -> list[str]:
        """The platform to take from a multi-platform image (before ``copy``)."""
        os_, arch, variant = parse_platform(self.platform)
        args = ["--override-os", os_, "--override-arch", arch]
        return args + (["--override-variant", variant] if variant else [])

    def skopeo_source_args(self, host: str, private_dir: Path) -> list[str]:
        """Credential and TLS options of ``skopeo copy`` for a registry source on ``host``;
        ``--creds`` goes into an auth file in ``private_dir`` (0600)."""
        args = []
        verify = self.tls_verify if self.tls_verify is not None else not _is_loopback(host)
        args.append(f"--src-tls-verify={'true' if verify else 'false'}")
        if self.creds is not None:
            user, password = parse_creds(self.creds)
            path = private_dir / "auth.json"
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"auths": {host: {"auth": token}}}, f)
            args.append(f"--src-authfile={path}")
        elif self.authfile is not None:
            args.append(f"--src-authfile={self.authfile}")
        return args

    def login_for(self, host: str) -> tuple[str, str] | None:
        """The login the referrer push uses: ``--creds``, else ``--authfile``'s entry for
        ``host``, else the standard auth files'."""
        if self.creds is not None:
            return parse_creds(self.creds)
        files = [Path(self.authfile)] if self.authfile else standard_authfiles()
        for f in files:
            found = login_in(f, host)
            if found:
                return found
        return None

    def matches(self, platform: dict) -> bool:
        """Whether an index entry's (or a config's) ``os``/``architecture``/``variant`` is
        this platform; an entry that names no platform matches (single-platform layouts)."""
        os_, arch, variant = parse_platform(self.platform)
        if platform.get("os", os_) != os_ or platform.get("architecture", arch) != arch:
            return False
        return variant is None or platform.get("variant", variant) == variant


def _is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in ("localhost", "::1", "[::1]") or name.startswith("127.")


def registry_host(spec: str) -> str | None:
    """The registry host of a ``docker://`` source, else None."""
    if not spec.startswith("docker://"):
        return None
    return spec.removeprefix("docker://").split("/", 1)[0]
