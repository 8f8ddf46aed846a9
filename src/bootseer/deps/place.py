"""Putting an environment at its prefix and taking one away, without ever removing what
bootseer did not make or what a running process uses (what is there, and who uses it:
``prefix``).

Everything is prepared in a temporary sibling of the prefix (same filesystem, so the final
``rename`` is atomic) and renamed into place whole; what was there is renamed away first,
then removed.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from bootseer.deps.mounts import unmount
from bootseer.deps.prefix import MARKER, Sibling, marker_of, occupant, rmtree, sidecar, users_here
from bootseer.deps.resolve import DepsError
from bootseer.node.libc import renameat2


def check_replaceable(prefix: str, key: str | None = None) -> str:
    """Raise unless what is at ``prefix`` may be replaced: ours (marker or mount)
    and unused. Returns the occupant kind."""
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
    """Take away our unused environment or mount at ``prefix`` (checked first)."""
    what = check_replaceable(prefix)
    if what == "mount":
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
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)
