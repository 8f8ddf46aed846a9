"""``bootseer doctor``: can this node do what bootseer needs? One check per line (FUSE,
container runtimes, the programs, libraries and extras' modules of node/tools.py, uv, the
store, the cache directory, GPUs, kernel features, user namespaces), each
saying what it found and, when it fails, what to do. Nothing is created or changed (the
EROFS probe mounts a temporary image and removes it)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass

from bootseer.config import BootseerConfig
from bootseer.node import tools
from bootseer.run import rootless

CAP_SYS_ADMIN = 21


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    required: bool
    detail: str
    hint: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


# -- FUSE -----------------------------------------------------------------------------------


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def has_cap_sys_admin() -> bool:
    return bool(_effective_caps() >> CAP_SYS_ADMIN & 1)


def check_dev_fuse() -> Check:
    try:
        st = os.stat("/dev/fuse")
    except OSError:
        return Check("/dev/fuse", False, True, "missing",
                     "load the fuse module (modprobe fuse); in a container, pass the device "
                     "(--device /dev/fuse)")
    if not stat.S_ISCHR(st.st_mode):
        return Check("/dev/fuse", False, True, "not a character device",
                     "/dev/fuse must be the FUSE device (10:229)")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return Check("/dev/fuse", False, True, "not readable and writable by this user",
                     "run as root or give this user access to /dev/fuse")
    return Check("/dev/fuse", True, True,
                 f"character device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")


def check_fuse_mount_permission() -> Check:
    """A FUSE mount needs CAP_SYS_ADMIN, or the set-uid fusermount3 helper for a user
    that is not root (root without the capability gets nothing from set-uid)."""
    helper = shutil.which("fusermount3")
    if helper is None:
        return Check("fusermount3", False, True, "not found on PATH", _hint("fusermount3"))
    if has_cap_sys_admin():
        return Check("mount permission", True, True, "CAP_SYS_ADMIN")
    setuid = bool(os.stat(helper).st_mode & stat.S_ISUID)
    if os.geteuid() != 0 and setuid:
        return Check("mount permission", True, True, f"{helper} is set-uid root")
    return Check("mount permission", False, True, "no CAP_SYS_ADMIN"
                 + ("" if setuid else f", and {helper} is not set-uid"),
                 "add CAP_SYS_ADMIN (a privileged pod, or --cap-add SYS_ADMIN)"
                 + ("" if setuid else f", or chmod u+s {helper}"))


# -- tools -----------------------------------------------------------------------------------


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"found, but '{' '.join(argv)}' failed: {e}"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0][:80] if text else "found"


def check_container_runtimes() -> list[Check]:
    """podman (with runc) is the default runtime, unshare+chroot the fallback: one of
    them is required by ``bootseer run --image``; containerd only for the snapshotter."""
    checks = []
    podman, runc = shutil.which("podman"), shutil.which("runc")
    checks.append(Check("podman", podman is not None, False,
                        _version(["podman", "--version"]) if podman else "not found",
                        None if podman else _hint("podman")))
    checks.append(Check("runc", runc is not None, False,
                        _version(["runc", "--version"]) if runc else "not found",
                        None if runc else _hint("runc")))
    if os.geteuid() != 0:   # a user's only runtime: podman and chroot here need root
        why = rootless.unavailable()
        checks.append(Check("container runtime", why is None, True,
                            "rootless (a user namespace)" if why is None else why.split(": ")[0],
                            None if why is None else why.split(": ", 1)[-1]))
        return checks + [_containerd()]
    chroot = bool(shutil.which("unshare") and shutil.which("chroot"))
    runnable = chroot or bool(podman and runc)
    checks.append(Check("container runtime", runnable, True,
                        ", ".join([*(["podman"] if podman and runc else []),
                                   *(["unshare+chroot"] if chroot else [])]) or "none",
                        None if runnable else "install podman and runc (or util-linux's "
                                              "unshare and coreutils' chroot)"))
    return checks + [_containerd()]


def _containerd() -> Check:
    containerd = shutil.which("containerd")
    return Check("containerd", containerd is not None, False,
                 _version(["containerd", "--version"]) if containerd else "not found",
                 None if containerd else _hint("containerd"))


def _hint(name: str) -> str:
    r = tools.BY_NAME[name]
    return f"{r.hint} ({r.needed_by})"


def check_uv() -> Check:
    import importlib.util
    exe = shutil.which("uv")
    if exe:
        return Check("uv", True, True, _version([exe, "--version"]))
    if importlib.util.find_spec("uv") is not None:
        return Check("uv", True, True, "the uv Python package (python -m uv)")
    return Check("uv", False, True, "not found", "pip install uv (deps resolves and builds "
                                                 "environments with it)")


# -- store and cache --------------------------------------------------------------------------


def _local_path(url: str) -> str | None:
    if url.startswith("file://"):
        return url[len("file://"):]
    return url if "://" not in url else None


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def check_store(config: BootseerConfig) -> Check:
    from bootseer import redact
    url = config.store.url
    if not url:
        return Check("store", False, True, "none configured",
                     "set BOOTSEER_STORE_URL (a shared directory, oci://, s3://...)")
    shown = redact.url(url)
    local = _local_path(url)
    if local is not None:   # looked at, not opened (opening creates its folders)
        if os.path.isdir(local):
            writable = os.access(local, os.W_OK)
            return Check("store", True, True, f"{shown}" + ("" if writable else " (read-only)"))
        base = _nearest_existing(local)
        if os.path.isdir(base) and os.access(base, os.W_OK):
            return Check("store", True, True, f"{shown} (not created yet; {base} is writable)")
        return Check("store", False, True, f"{shown} does not exist and cannot be created "
                                           f"under {base}",
                     "point BOOTSEER_STORE_URL at a shared directory this node can reach")
    try:
        from bootseer.store import open_store
        store = open_store(url, config)
        store.get_ref("bootseer/doctor")   # one round trip: reachable, and answering
    except Exception as e:  # noqa: BLE001 - whatever the driver raises is the finding
        return Check("store", False, True, f"{shown}: {redact.text(str(e)) or type(e).__name__}",
                     getattr(e, "hint", None) or "check the URL, the network and credentials")
    return Check("store", True, True, f"{shown} reachable"
                 + ("" if getattr(store, "writable", True) else " (read-only)"))


def check_cache_dir(config: BootseerConfig) -> Check:
    path = config.cache.dir
    at = path if os.path.exists(path) else _nearest_existing(path)
    if not os.path.isdir(at):
        return Check("cache directory", False, True, f"{at} is not a directory",
                     "set BOOTSEER_CACHE_DIR to a local directory")
    if not os.access(at, os.W_OK | os.X_OK):
        return Check("cache directory", False, True, f"{at} is not writable",
                     "set BOOTSEER_CACHE_DIR to a local directory this user can write")
    free = shutil.disk_usage(at).free
    return Check("cache directory", True, True,
                 f"{path}{'' if at == path else ' (not created yet)'}, "
                 f"{free / 1e9:.1f} GB free")


# -- GPUs and kernel ---------------------------------------------------------------------------


def check_gpus() -> Check:
    import glob

    from bootseer.run.devices import load_cdi_specs
    gpus = sorted(p for p in glob.glob("/dev/nvidia[0-9]*"))
    try:
        cdi = [d for s in load_cdi_specs() for d in s.devices if "nvidia" in s.kind]
    except Exception as e:  # noqa: BLE001 - a broken spec is the finding
        return Check("GPUs / CDI", False, False, str(e), "fix or remove that CDI spec")
    if not gpus:
        return Check("GPUs / CDI", True, False, "no NVIDIA GPUs (jobs run without them)")
    return Check("GPUs / CDI", True, False, f"{len(gpus)} NVIDIA GPU(s); "
                 + (f"CDI spec with {len(cdi)} device(s)" if cdi else
                    "no CDI spec (device nodes are passed)"),
                 None if cdi else "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")


_WITHOUT_EROFS = "lazy trees are served by FUSE, environments restored by extraction"


def check_erofs() -> Check:
    from bootseer.mount.erofs import kernel
    if not kernel.registered():
        return Check("kernel: EROFS", False, False, "not in /proc/filesystems",
                     f"modprobe erofs (else {_WITHOUT_EROFS})")
    why = kernel.availability()
    if why is None:
        return Check("kernel: EROFS", True, False, "file-backed mounts work")
    return Check("kernel: EROFS", False, False, f"registered, but {why}",
                 f"Linux 6.12+ mounts EROFS from files (else {_WITHOUT_EROFS})")


def check_fuse_passthrough() -> Check:
    # the same probe that picks the checkpoint mount's server (ckpt.fuse=auto), so doctor
    # and the mount never disagree
    from bootseer.mount.devfuse.probe import passthrough_unavailable
    release = os.uname().release
    why = passthrough_unavailable()
    if why is None:
        return Check("kernel: FUSE passthrough", True, False,
                     f"{release}: works (checkpoint mounts read staged files through it)")
    return Check("kernel: FUSE passthrough", False, False, f"{release}: {why}",
                 "Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH=y, as root, reads staged checkpoint "
                 "files at native speed (else checkpoint mounts use mfusepy)")


def check_tools() -> list[Check]:
    """The programs, libraries and extras' modules no other check covers
    (bootseer.node.tools: the same hint a command that needs one gives)."""
    covered = {"fusermount3", "podman", "runc", "containerd"}
    out = []
    for r in tools.REQUIREMENTS:
        if r.name in covered:
            continue
        found = tools.find(r)
        out.append(Check(r.name, found is not None, r.required,
                         _describe(r, found) if found else f"not found: {r.needed_by} "
                                                           "cannot work",
                         None if found else _hint(r.name)))
    return out


def _describe(r: tools.Requirement, found: str) -> str:
    if r.kind == "program":
        return _version([found, "--version"])
    if r.kind == "module":
        import importlib
        return f"{r.probe} {getattr(importlib.import_module(r.probe), '__version__', '')}"
    return found


def check_user_namespaces() -> Check:
    """Unprivileged user namespaces: how a user without root enters a lazy image
    (``bootseer run --image``'s rootless runtime, rootless podman), so required of such a
    user; the FUSE side has its own rows (/dev/fuse, mount permission)."""
    why = rootless.userns_unavailable()
    if why is not None:
        what, todo = why.split(": ", 1)
        return Check("user namespaces", False, os.geteuid() != 0, what,
                     f"{todo} ('bootseer run --image' without root and rootless podman "
                     f"need them)")
    limit = rootless.read_sysctl(rootless.MAX_USERNS)
    return Check("user namespaces", True, False,
                 f"available to every user (max {limit})" if limit else "available")


CRIU_MIN = (4, 1)


def check_criu() -> Check:
    """CRIU, for the warm-start design's snapshot backend (docs/warm-start.md): versions
    before 4.1 fail on recent kernels (the vDSO). Never required: warm starts fork from a
    zygote without it."""
    found = shutil.which("criu")
    if found is None:
        return Check("criu", False, False, "not found: warm starts use the fork server only",
                     f"CRIU >= {CRIU_MIN[0]}.{CRIU_MIN[1]} (criu.org) would let a warm "
                     "process be snapshotted; nothing needs it today")
    line = _version([found, "--version"])
    m = re.search(r"(\d+)\.(\d+)", line)
    version = (int(m.group(1)), int(m.group(2))) if m else None
    if version is None or version < CRIU_MIN:
        return Check("criu", False, False, f"{line}: older than "
                     f"{CRIU_MIN[0]}.{CRIU_MIN[1]} (fails on recent kernels: the vDSO)",
                     f"CRIU >= {CRIU_MIN[0]}.{CRIU_MIN[1]}; warm starts use the fork server")
    return Check("criu", True, False, f"{line} (warm-start snapshots: design only)")


def run_checks(config: BootseerConfig | None = None) -> list[Check]:
    config = config or BootseerConfig.from_env()
    steps: list[Callable[[], Check | list[Check]]] = [
        check_dev_fuse, check_fuse_mount_permission, check_container_runtimes, check_uv,
        check_tools, lambda: check_store(config), lambda: check_cache_dir(config),
        check_gpus, check_erofs, check_fuse_passthrough, check_user_namespaces, check_criu]
    checks: list[Check] = []
    for step in steps:
        found = step()
        checks.extend(found if isinstance(found, list) else [found])
    return checks


def healthy(checks: list[Check]) -> bool:
    return all(c.ok for c in checks if c.required)


def table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        status = "ok" if c.ok else ("MISSING" if c.required else "no")
        lines.append(f"{c.name:<{width}}  {status:<7}  {c.detail}")
        if c.hint and not c.ok:
            lines.append(f"{'':<{width}}  {'':<7}  hint: {c.hint}")
    missing = [c.name for c in checks if c.required and not c.ok]
    optional = [c.name for c in checks if not c.required and not c.ok]
    lines.append("")
    lines.append(("MISSING: " + ", ".join(missing) if missing else "required: all present")
                 + ("; not available: " + ", ".join(optional) + " (see the hints)"
                    if optional else ""))
    return "\n".join(lines)
