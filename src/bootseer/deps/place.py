"""Putting an environment at its prefix and taking one away, without ever removing what
bootseer did not make or what a running process uses.

Everything is prepared in a temporary sibling of the prefix (same filesystem, so the final
``rename`` is atomic) and renamed into place whole; what was there is renamed away first,
then removed. Each temporary sibling ``<prefix>.<kind>-<pid>-<tag>`` comes with a liveness
mark ``<sibling>.alive`` (``bootseer.node.alive``) held for as long as its maker lives: the next
command on the node removes a sibling only when its mark exists and nobody holds it, which
proves the sibling is a dead bootseer process's leftover (a pid alone could be reused, and
a name alone could be anyone's).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import secrets
from pathlib import Path

from bootseer.node.alive import Mark, held
from bootseer.deps.resolve import DepsError

KINDS = ("building", "restoring", "old", "scratch")
_SIBLING = re.compile(r"\.(?:%s)-\d+-[0-9a-f]+$" % "|".join(KINDS))


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

    def __enter__(self) -> "Sibling":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sweep_leftovers(prefix: str) -> list[str]:
    """Remove the temporary siblings of ``prefix`` whose maker died (a killed build,
    restore or removal). Returns the paths removed."""
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
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def marker_of(prefix: str) -> dict | None:
    """The completion marker inside ``prefix`` (a restored or built environment)."""
    from bootseer.deps.snapshot import MARKER
    if os.path.islink(prefix):
        return None
    try:
        m = json.loads((Path(prefix) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("key"), str) else None


def occupant(prefix: str) -> str:
    """What is at ``prefix``: "none" (absent or an empty directory), "mount" (our lazy
    mount, live or left by a dead server), "env" (our environment: its marker is
    inside), or "foreign" (anything else: never touched)."""
    from bootseer.deps.mounted import is_mount_point, sidecar
    if is_mount_point(prefix):
        return "mount" if os.path.exists(sidecar(prefix)) else "foreign"
    if not os.path.lexists(prefix):
        return "none"
    if os.path.islink(prefix) or not os.path.isdir(prefix):
        return "foreign"
    if not os.listdir(prefix):
        return "none"
    return "env" if marker_of(prefix) is not None else "foreign"


def users_here(prefix: str) -> list[int]:
    """The processes that use ``prefix``, except this command's own ancestors (which
    wait for it), other ensures of the prefix (``--prefix P`` names it, does not use it)
    and the lazy mount's server."""
    from bootseer.deps.mounted import mounted_info
    from bootseer.deps.node import users
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


def check_replaceable(prefix: str, key: str | None = None) -> str:
    """Raise unless what is at ``prefix`` may be replaced: ours (marker or lazy mount)
    and unused. Returns the occupant kind."""
    from bootseer.deps.snapshot import MARKER
    what = occupant(prefix)
    if what == "foreign":
        raise DepsError(f"{prefix} exists and was not made by bootseer (no {MARKER}): "
                        f"refusing to overwrite it; choose another --prefix or remove it")
    if what != "none":
        pids = users_here(prefix)
        if pids:
            old = (marker_of(prefix) or {}).get("key", "")
            raise DepsError(f"{prefix} holds environment {old[:19] or '(mounted)'}, in use by "
                            f"pid {', '.join(map(str, pids[:5]))}: refusing to replace it"
                            f"{' with ' + key[:19] if key else ''} while it runs; stop the job "
                            f"or choose another --prefix")
    return what


def clear(prefix: str) -> None:
    """Take away our unused environment or lazy mount at ``prefix`` (checked first)."""
    what = check_replaceable(prefix)
    if what == "mount":
        from bootseer.deps.mounted import sidecar, unmount
        unmount(prefix)
        Path(sidecar(prefix)).unlink(missing_ok=True)
    elif what == "env":
        with Sibling(prefix, "old") as old:   # vanishes whole, never half
            os.rename(prefix, old.path)


def put(ready: str, prefix: str, key: str) -> None:
    """Rename the finished environment at ``ready`` (a sibling of ``prefix``) into place,
    replacing ours there if it is unused."""
    what = check_replaceable(prefix, key)
    if what == "mount":
        clear(prefix)
    if what != "env":
        os.rename(ready, prefix)     # over nothing, or over an empty directory (atomic)
        return
    if _exchange(ready, prefix):
        rmtree(ready)        # the old environment, now at the sibling's name
        return
    with Sibling(prefix, "old") as old:   # no atomic exchange here: absent for a moment
        os.rename(prefix, old.path)
        os.rename(ready, prefix)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE), so a job starting meanwhile
    sees the old environment or the new one, never none. False where the filesystem or
    the C library cannot (NFS, old glibc): the caller renames twice."""
    import ctypes
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                   ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def sweep_stale_sidecar(prefix: str) -> None:
    """A ``<prefix>.mount.json`` with no mount at the prefix was left by a server that
    is gone and unmounted: it proves nothing about the directory, so drop it."""
    from bootseer.deps.mounted import is_mount_point, sidecar
    if os.path.exists(sidecar(prefix)) and not is_mount_point(prefix):
        Path(sidecar(prefix)).unlink(missing_ok=True)
