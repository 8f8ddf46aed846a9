"""How ``image convert`` talks to a registry, the way skopeo and podman users expect:
credentials (``--creds``, ``--authfile``, else the standard auth files and credential
helpers: store/logins.py), TLS verification,
the platform picked from a multi-platform index, and whether the converted tree is
announced next to its source (the referrer).

Credentials never reach a command line (``ps`` shows those to every user): the login
bootseer resolved (``--creds``, or what an auth file or credential helper gives) is written
to a private auth file that skopeo reads, removed with the convert's state; so skopeo pulls
with the very login the referrer push uses, credential helpers included."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from bootseer.errors import UsageError
from bootseer.store import logins

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

    def skopeo_source_args(self, host: str, private_dir: Path,
                           repository: str | None = None) -> list[str]:
        """Credential and TLS options of ``skopeo copy`` for a registry source on ``host``
        (its ``repository``: ``team/app``); the login goes into an auth file in
        ``private_dir`` (0600)."""
        args = []
        verify = self.tls_verify if self.tls_verify is not None else not _is_loopback(host)
        args.append(f"--src-tls-verify={'true' if verify else 'false'}")
        login = self.login_for(host, repository)
        if login is not None:
            path = private_dir / "auth.json"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"auths": {host: login.auth_entry()}}, f)
            args.append(f"--src-authfile={path}")
        elif self.authfile is not None:
            args.append(f"--src-authfile={self.authfile}")
        return args

    def login_for(self, host: str, repository: str | None = None) -> logins.Login | None:
        """The login for ``host`` (and its ``repository``, for logins kept per namespace):
        ``--creds``, else ``--authfile``'s, else the standard auth files' (credential
        helpers included)."""
        if self.creds is not None:
            return logins.Login(*parse_creds(self.creds))
        return logins.find(host, self.authfile, repository=repository)

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


# where docker's short names live: ``alpine`` is docker.io/library/alpine (logins for it are
# found under docker.io's other spellings too: store/logins.py)
DOCKER_HUB = "docker.io"


def _split_reference(spec: str) -> tuple[str, str] | None:
    """(registry host, path with tag or digest) of a ``docker://`` source, as docker's
    reference grammar splits it: the first component is a host only if it has a ``.``
    or a ``:``, is ``localhost`` or has an upper-case letter (``alpine``, ``team/app``
    are Docker Hub's)."""
    if not spec.startswith("docker://"):
        return None
    name = spec.removeprefix("docker://")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"
                  or first != first.lower()):
        host, path = first, rest
    else:
        host, path = DOCKER_HUB, name
    if host == "index.docker.io":   # docker's legacy name of the same registry
        host = DOCKER_HUB
    if host == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    return host, path


def registry_host(spec: str) -> str | None:
    """The registry host of a ``docker://`` source, else None."""
    split = _split_reference(spec)
    return split[0] if split else None


def registry_repository(spec: str) -> str | None:
    """The repository (``team/app``) of a ``docker://`` source, without tag or digest."""
    split = _split_reference(spec)
    if split is None:
        return None
    path = split[1].partition("@")[0]
    head, _, last = path.rpartition("/")
    last = last.partition(":")[0]   # the tag
    return (f"{head}/{last}" if head else last) or None


def pull_bytes(transport: str, registry: RegistryOptions, source_args: list[str]) -> int | None:
    """Bytes ``skopeo copy`` of the ``docker://`` source will fetch (its manifest's config
    and layers, for ``registry``'s platform): the total of the pull's progress bar. None
    when skopeo cannot say (the copy then reports what it failed on)."""
    import subprocess

    from bootseer.node import proc as procs
    args = [a.replace("--src-", "--", 1) for a in source_args]   # inspect's spellings

    def raw(ref: str) -> dict | None:
        try:
            p = subprocess.run(["skopeo", "inspect", "--raw", *args, ref], capture_output=True,
                               text=True, timeout=60, preexec_fn=procs.preexec())
            doc = json.loads(p.stdout) if p.returncode == 0 else None
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None
        return doc if isinstance(doc, dict) else None

    manifest = raw(transport)
    if manifest is not None and isinstance(manifest.get("manifests"), list):
        entry = next((m for m in manifest["manifests"] if isinstance(m, dict)
                      and registry.matches(m.get("platform") or {})), None)
        name = transport.split("@", 1)[0]
        repo, _, last = name.rpartition("/")
        manifest = raw(f"{repo}/{last.split(':', 1)[0]}@{entry['digest']}") \
            if entry and isinstance(entry.get("digest"), str) else None
    if manifest is None:
        return None
    blobs = [manifest.get("config") or {}, *(manifest.get("layers") or [])]
    sizes = [b.get("size") for b in blobs if isinstance(b, dict)]
    return sum(n for n in sizes if isinstance(n, int) and n >= 0) or None
