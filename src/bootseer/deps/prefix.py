"""The state of a prefix: what is at P and what bootseer keeps beside it. Every other
module of ``deps`` asks here.

At P: nothing (absent, or an empty directory); a copy (an extracted or built
environment: its completion marker ``P/.bootseer-env.json`` inside); a kernel mount (a
restore: EROFS on the snapshot's blob, under an overlay when writable); a FUSE mount (a
lazy environment, ``deps ensure --mount``: its server in a session of its own); or
anything else (someone else's: never touched).

Beside P:

- ``P.mount.json``, the sidecar, names a mount of ours: key, tree, and the server's pid
  (FUSE) or the mount id (kernel; written before the mount and completed after it, so a
  command killed in between leaves a mount still recognised as ours);
- ``P.mount-state/``, the mount's state: a lazy mount's recording and server log, a
  kernel mount's overlay directories;
- temporary siblings ``P.<kind>-<pid>-<tag>``, each with a liveness mark
  ``<sibling>.alive`` (``bootseer.node.alive``) held for as long as its maker lives: the
  next command removes a sibling only when its mark exists and nobody holds it, which
  proves the sibling is a dead bootseer process's leftover (a pid alone could be reused,
  and a name alone could be anyone's);
- ``P.lock``, the node's lock of one ensure (or run, or gc) at a time.
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import shutil
import stat
from pathlib import Path

from bootseer.node import mounts
from bootseer.node.alive import Mark, held
from bootseer.node.proc import pid_alive
from bootseer.node.procfs import LOCAL, ProcView

MARKER = ".bootseer-env.json"
KERNEL_BACKEND = "erofs"      # the sidecar's "backend" of a kernel restore (no server)
KINDS = ("building", "restoring", "old", "scratch")
_SIBLING = re.compile(rf"\.(?:{'|'.join(KINDS)})-\d+-[0-9a-f]+$")


def sidecar(prefix: str) -> str:
    return f"{prefix}.mount.json"


def state_dir(prefix: str) -> str:
    return f"{prefix}.mount-state"


# -- markers and mounts -----------------------------------------------------------------------
def marker_of(prefix: str) -> dict | None:
    """The completion marker inside ``prefix`` (a restored or built environment)."""
    if os.path.islink(prefix):
        return None
    try:
        m = json.loads((Path(prefix) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("key"), str) else None


def read_marker(prefix: str) -> dict | None:
    """The completion marker of a restored or built prefix, or of a live mount."""
    try:
        return json.loads((Path(prefix) / MARKER).read_text())
    except (OSError, ValueError):
        return mounted_info(prefix)


def sidecar_info(prefix: str) -> dict | None:
    """What the sidecar records (whether or not its mount is live)."""
    try:
        info = json.loads(Path(sidecar(prefix)).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def is_kernel(info: dict | None) -> bool:
    """Whether the sidecar names a kernel mount (a restore: EROFS, no server)."""
    return info is not None and info.get("backend") == KERNEL_BACKEND


def kernel_mount_live(prefix: str, info: dict, view: ProcView = LOCAL) -> bool:
    """Whether the kernel mount the sidecar ``info`` names is the one at ``prefix`` (the
    topmost mount there has the mount id recorded when it was made, and the server of a
    blob still being filled, if any, lives)."""
    entry = mounts.find(prefix, view.mountinfo)
    if entry is None or info.get("mount_id") is None or entry.mount_id != info["mount_id"]:
        return False
    # a blob still being filled is served by a process: dead, the mount reads fail
    server = int(info.get("server_pid") or 0)
    return not server or (pid_alive(server) if view is LOCAL else view.alive(server))


def mounted_info(prefix: str, view: ProcView = LOCAL) -> dict | None:
    """The live mount at ``prefix``: a lazy one (``{"key", "tree", "pid"}``) or a kernel
    restore (``{"key", "tree", "backend": "erofs", "blob", "mount_id", ...}``), or None.
    ``view``: where the node's processes and mounts are read (``node.procfs``)."""
    info = sidecar_info(prefix)
    if info is None:
        return None
    if is_kernel(info):
        return info if kernel_mount_live(prefix, info, view) else None
    pid = int(info.get("pid", 0))
    if mounts.is_mount_point(prefix, view.mountinfo) and \
            (pid_alive(pid) if view is LOCAL else view.alive(pid)):
        return info
    return None


def overlay_damage(prefix: str) -> list[str]:
    """Paths of the published environment that were deleted or hidden through the
    writable overlay of a kernel mount at ``prefix`` (whiteouts and opaque directories in
    its upper directory), first few only; empty when there is none or no overlay. New
    files (a job's ``__pycache__``) are no damage: they hide nothing published."""
    upper = os.path.join(state_dir(prefix), "upper")
    found: list[str] = []
    for root, dirs, files in os.walk(upper):
        rel = os.path.relpath(root, upper)
        for name in dirs + files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            shown = os.path.normpath(os.path.join("/", rel, name))
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:     # a whiteout
                found.append(shown)
            elif stat.S_ISDIR(st.st_mode) and _opaque(path):     # hides what was below
                found.append(shown + "/")
            if len(found) >= 5:
                return found
    return found


def _opaque(path: str) -> bool:
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            pass
    return False


def form(prefix: str) -> str:
    """How the environment at ``prefix`` is there: ``directory`` (a copy), ``mount`` (a
    kernel restore) or ``lazy`` (a FUSE mount)."""
    info = mounted_info(prefix)
    return "directory" if info is None else "mount" if is_kernel(info) else "lazy"


def occupant(prefix: str) -> str:
    """What is at ``prefix``: "none" (absent or an empty directory), "mount" (our mount,
    live or left by a dead server), "env" (our environment: its marker is inside), or
    "foreign" (anything else: never touched)."""
    if mounts.is_mount_point(prefix):
        return "mount" if os.path.exists(sidecar(prefix)) else "foreign"
    if not os.path.lexists(prefix):
        return "none"
    if os.path.islink(prefix) or not os.path.isdir(prefix):
        return "foreign"
    if not os.listdir(prefix):
        return "none"
    return "env" if marker_of(prefix) is not None else "foreign"


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` whole: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def empty_or_absent(path: str) -> bool:
    try:
        return not os.path.islink(path) and not os.listdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def sweep_stale_sidecar(prefix: str) -> None:
    """A sidecar with no mount at the prefix was left by a server that is gone and
    unmounted: it proves nothing about the directory, so drop it."""
    if os.path.exists(sidecar(prefix)) and not mounts.is_mount_point(prefix):
        Path(sidecar(prefix)).unlink(missing_ok=True)


# -- who uses it ------------------------------------------------------------------------------
def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def users(prefix: str, *, ignore_option: str | None = None,
          view: ProcView = LOCAL) -> list[int]:
    """PIDs of processes that use anything under ``prefix``: their executable, command
    line, working directory, open files or mapped libraries lie there. With
    ``ignore_option`` (``--prefix``), a command-line argument given as that option's value
    is not a use: it names the environment to make (another ``deps ensure`` waiting for
    this one). ``view``: whose processes (the node's, from a pod: ``node.procfs``); the
    PIDs are numbered as it numbers them, and one it does not let us read counts as a
    user (never removed on a guess)."""
    prefix = os.path.realpath(prefix)
    found = []
    me = view.own_pid()
    for pid in view.pids():
        if pid == me:
            continue
        base = os.path.join(view.root, str(pid))
        try:
            paths = [os.readlink(f"{base}/cwd"), os.readlink(f"{base}/exe")]
            with open(f"{base}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            paths += [a for i, a in enumerate(argv)
                      if not (ignore_option and i and argv[i - 1] == ignore_option)]
            try:
                fds = os.listdir(f"{base}/fd")
            except OSError:
                fds = []
            for fd in fds:
                try:
                    paths.append(os.readlink(f"{base}/fd/{fd}"))
                except OSError:
                    pass
            with open(f"{base}/maps") as f:
                paths += [line.split(None, 5)[5].strip() for line in f
                          if len(line.split(None, 5)) == 6]
        except PermissionError:
            # The node's process, hidden from this pod: cannot tell, so it counts. The
            # node's init is no job's process (and some hosts hide it even from root).
            if view is not LOCAL and pid != 1:
                found.append(pid)
            continue
        except OSError:   # exited meanwhile, or not ours to look at
            continue
        if any(_under(p, prefix) for p in paths):
            found.append(pid)
    return found


def users_here(prefix: str) -> list[int]:
    """The processes that use ``prefix``, except this command's own ancestors (which
    wait for it), other ensures of the prefix (``--prefix P`` names it, does not use it)
    and the lazy mount's server."""
    skip, pid = set(), os.getpid()
    while pid > 1:
        skip.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    info = mounted_info(prefix)
    if info:
        skip.add(int(info.get("pid", 0)))
    return [p for p in users(prefix, ignore_option="--prefix") if p not in skip]


# -- temporary siblings -----------------------------------------------------------------------
class Sibling:
    """A temporary sibling of ``prefix`` (not created: the caller makes it, or renames
    something to it), provably ours while and after we hold it. ``close`` removes it."""

    def __init__(self, prefix: str, kind: str):
        assert kind in KINDS
        self.path = f"{prefix}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"
        self._mark = Mark(self.path + ".alive")

    def close(self) -> None:
        rmtree(self.path)
        self._mark.release()

    def __enter__(self) -> Sibling:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sweep_leftovers(prefix: str) -> list[str]:
    """Remove the temporary siblings of ``prefix`` whose maker died (a killed build,
    restore or removal). Returns the paths removed. (The prefix itself is only ever
    renamed into place whole, so it is never partial.)"""
    removed = []
    for mark in glob.glob(f"{glob.escape(prefix)}.*-*.alive"):
        path = mark[:-len(".alive")]
        if not _SIBLING.search(path) or held(mark) is not False:
            continue
        if os.path.lexists(path) and (os.path.islink(path) or not os.path.isdir(path)):
            continue        # not a directory we made: leave it (and its mark) alone
        rmtree(path)
        Path(mark).unlink(missing_ok=True)
        removed.append(path)
    return removed


def rmtree(path: str) -> None:
    """Remove the directory tree at ``path`` (our environments are read-only: make each
    directory writable first). A symlink is removed, never followed."""
    if os.path.islink(path):
        os.unlink(path)
        return
    if not os.path.isdir(path):
        return
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            p = os.path.join(root, d)
            if not os.path.islink(p):
                os.chmod(p, 0o755)
    os.chmod(path, 0o755)
    shutil.rmtree(path, ignore_errors=True)
