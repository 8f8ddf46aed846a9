"""Files bootseer owns in its cache (EROFS blobs, metadata images), written beside their
final name and renamed into place when complete: ``<name>.part-<pid>-<tag>``, locked
(an exclusive ``flock``) by its writer for as long as it writes.

A writer killed midway (SIGKILL, OOM) leaves its part: the next writer in the directory
removes it (:func:`sweep_dead`), so a crash does not leak the blob's bytes on the node.
A part is removed only when nobody holds its lock and no process with the writer's pid
runs here: a live writer's part is never touched (the pid covers the instant between
the part's creation and its lock). The kernel drops the lock when the writer dies; a
probe of it sees writers in any PID namespace, and one from the writer's own process
conflicts too (``flock`` locks belong to the open file; :mod:`bootseer.node.alive` probes its
marks the same way).
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import secrets
import stat

log = logging.getLogger(__name__)


class PartFile:
    """A part of ``dest`` open for writing at ``fd``: :meth:`commit` renames it to
    ``dest``; :meth:`close` (also on leaving a ``with`` block) removes what was not
    committed."""

    def __init__(self, dest: str | os.PathLike[str], mode: int = 0o600):
        self.dest = str(dest)
        self.path = f"{self.dest}.part-{os.getpid()}-{secrets.token_hex(4)}"
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        fcntl.flock(self._fd, fcntl.LOCK_EX)   # held until closed: the writer is alive

    @property
    def fd(self) -> int:
        """The part's descriptor, open for writing until :meth:`commit` or :meth:`close`."""
        if self._fd is None:
            raise ValueError(f"{self.path}: the part is closed")
        return self._fd

    def commit(self, mode: int | None = None) -> None:
        """Rename the part to ``dest`` (``mode``: set first, e.g. 0o444) and close it."""
        if mode is not None:
            os.fchmod(self.fd, mode)
        os.replace(self.path, self.dest)
        self._close_fd()

    def close(self) -> None:
        if os.path.lexists(self.path):   # removed while still locked: no sweep races us
            os.unlink(self.path)
        self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> PartFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_atomic(dest: str | os.PathLike[str], data: bytes) -> None:
    """``data`` at ``dest`` (mode 0600), replaced whole: a reader sees the old file or
    the new."""
    with PartFile(dest) as part:
        with open(part.fd, "wb", closefd=False) as f:
            f.write(data)
        part.commit()


def _writer_pid(part: str) -> int | None:
    try:
        return int(part.rsplit(".part-", 1)[1].split("-", 1)[0])
    except (IndexError, ValueError):
        return None


def _runs_here(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # another user's process
    return True


def sweep_dead(directory: str | os.PathLike[str]) -> list[str]:
    """Remove the parts in ``directory`` whose writer is gone (see the module docstring);
    return the parts removed."""
    removed = []
    for part in glob.glob(os.path.join(glob.escape(str(directory)), "*.part-*")):
        if _runs_here(_writer_pid(part)):
            continue
        try:
            fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue   # gone meanwhile, or a link: not a part we wrote
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue   # its writer holds it
        else:   # still the file we locked (not renamed or replaced since): remove it
            st = os.fstat(fd)
            try:
                same = stat.S_ISREG(st.st_mode) and os.path.samestat(st, os.lstat(part))
            except FileNotFoundError:
                same = False
            if same:
                os.unlink(part)
                removed.append(part)
                log.info("removed %s, left by a writer that died", part)
        finally:
            os.close(fd)
    return removed
