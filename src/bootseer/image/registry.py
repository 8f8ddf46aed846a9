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
import platform as _machine
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


# platform.machine() -> OCI's architecture (and variant) names
_OCI_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
             "armv7l": "arm/v7", "armv6l": "arm/v6", "i686": "386", "i386": "386"}


def node_platform(override: str | None = None) -> str:
    """This node's platform as OCI names it (``linux/amd64``, ``linux/arm64``): ``override``
    (the ``mount.platform`` setting) where given, else ``platform.machine()`` mapped."""
    if override:
        return "/".join(filter(None, parse_platform(override)))
    machine = _machine.machine().lower()
    return f"linux/{_OCI_ARCH.get(machine, machine)}"


def platform_of(desc: dict) -> str | None:
    """``os/arch[/variant]`` of an index entry's ``platform`` (or an image config); None
    where it names none (attestation manifests say ``unknown/unknown``)."""
    os_, arch = desc.get("os"), desc.get("architecture")
    if not isinstance(os_, str) or not isinstance(arch, str) or "unknown" in (os_, arch):
        return None
    variant = desc.get("variant")
    return "/".join([os_, arch] + ([variant] if isinstance(variant, str) and variant else []))


def platform_matches(wanted: str, platform: dict) -> bool:
    """Whether an entry's ``os``/``architecture``/``variant`` is ``wanted``; an entry that
    names no platform matches (single-platform layouts), a wanted without variant any."""
    os_, arch, variant = parse_platform(wanted)
    if platform.get("os", os_) != os_ or platform.get("architecture", arch) != arch:
        return False
    return variant is None or platform.get("variant", variant) == variant


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
    platform: str | None = None
    """``os/arch[/variant]``, a comma list of those, or ``all``: which images of a
    multi-platform index to convert. None: every one an index offers; a single-platform
    image then must be this node's (``node_platform()``)."""
    referrer: bool = True
    """Announce the converted tree in the source repository (an OCI referrer)."""

    def __post_init__(self):
        self.wanted()   # a malformed --platform fails before anything is pulled
        if self.creds is not None:
            parse_creds(self.creds)
        if self.authfile is not None and not Path(self.authfile).is_file():
            raise UsageError(f"--authfile {self.authfile}: no such file")

    def wanted(self) -> list[str] | None:
        """The platforms asked for (``os/arch[/variant]`` each), or None for all."""
        if self.platform is None or self.platform.strip().lower() == "all":
            return None
        return ["/".join(filter(None, parse_platform(p)))
                for p in self.platform.split(",") if p.strip()] or None

    def skopeo_global_args(self) -> list[str]:
        """The platform to take from a multi-platform image (before ``copy``), where one
        is asked; else none (``copy_args`` copies them all)."""
        wanted = self.wanted()
        if wanted is None or len(wanted) > 1:
            return []
        os_, arch, variant = parse_platform(wanted[0])
        args = ["--override-os", os_, "--override-arch", arch]
        return args + (["--override-variant", variant] if variant else [])

    def copy_args(self) -> list[str]:
        """``skopeo copy --all`` where more than one platform may be converted."""
        wanted = self.wanted()
        return ["--all"] if wanted is None or len(wanted) > 1 else []

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
        one asked for (any, where all are); an entry that names no platform matches."""
        wanted = self.wanted()
        return wanted is None or any(platform_matches(w, platform) for w in wanted)


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

    top = raw(transport)
    manifests = [top]
    if top is not None and isinstance(top.get("manifests"), list):
        entries = [m for m in top["manifests"] if isinstance(m, dict)
                   and isinstance(m.get("digest"), str)]
        if not registry.copy_args():   # one platform: skopeo copies its image only
            entries = [m for m in entries if registry.matches(m.get("platform") or {})][:1]
        name = transport.split("@", 1)[0]
        repo, _, last = name.rpartition("/")
        manifests = [raw(f"{repo}/{last.split(':', 1)[0]}@{m['digest']}") for m in entries]
    if not manifests or any(m is None for m in manifests):
        return None
    blobs = [b for m in manifests if m is not None
             for b in (m.get("config") or {}, *(m.get("layers") or []))]
    sizes = [b.get("size") for b in blobs if isinstance(b, dict)]
    return sum(n for n in sizes if isinstance(n, int) and n >= 0) or None
