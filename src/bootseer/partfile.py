"""Files bootseer owns in its cache (EROFS blobs, metadata images), written beside their
final name and renamed into place when complete: ``<name>.part-<pid>-<tag>``, with a
liveness mark (``<part>.alive``, :mod:`bootseer.alive`) held while its writer lives.

A writer killed midway (SIGKILL, OOM) leaves its part: the next writer in the directory
removes it (:func:`sweep_dead`), so a crash does not leak the blob's bytes on the node.
A part is removed only when its mark is held by nobody and no process with the writer's
pid runs here: a live writer's part is never touched (the pid check covers the instant
between the mark's creation and its lock).
"""

from __future__ import annotations

import glob
import logging
import os
import secrets
from pathlib import Path

from bootseer.alive import Mark, held

log = logging.getLogger(__name__)
MARK_SUFFIX = ".alive"


class PartFile:
    """A part of ``dest`` open for writing at ``fd``: :meth:`commit` renames it to
    ``dest``; :meth:`close` (also on leaving a ``with`` block) removes what was not
    committed and drops the mark."""

    def __init__(self, dest: str | os.PathLike, mode: int = 0o600):
        self.dest = str(dest)
        self.path = f"{self.dest}.part-{os.getpid()}-{secrets.token_hex(4)}"
        self._mark: Mark | None = Mark(self.path + MARK_SUFFIX)   # before the part exists
        try:
            self.fd: int | None = os.open(
                self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        except BaseException:
            self._mark.release()
            raise

    def commit(self, mode: int | None = None) -> None:
        """Close the part and rename it to ``dest`` (``mode``: set first, e.g. 0o444)."""
        self._close_fd()
        if mode is not None:
            os.chmod(self.path, mode)
        os.replace(self.path, self.dest)

    def close(self) -> None:
        self._close_fd()
        if os.path.lexists(self.path):
            os.unlink(self.path)
        if self._mark is not None:   # last: a kill before this leaves only a dead mark
            self._mark.release()
            self._mark = None

    def _close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "PartFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_atomic(dest: str | os.PathLike, data: bytes) -> None:
    """``data`` at ``dest`` (mode 0600), replaced whole: a reader sees the old file or
    the new."""
    with PartFile(dest) as part:
        with open(part.fd, "wb", closefd=False) as f:
            f.write(data)
        part.commit()


def _writer_pid(mark: str) -> int | None:
    try:
        return int(mark.rsplit(".part-", 1)[1].split("-", 1)[0])
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


def sweep_dead(directory: str | os.PathLike) -> list[str]:
    """Remove the parts in ``directory`` whose writer is gone (see the module docstring);
    return the parts removed."""
    removed = []
    for mark in glob.glob(os.path.join(glob.escape(str(directory)), f"*.part-*{MARK_SUFFIX}")):
        if held(mark) is not False or _runs_here(_writer_pid(mark)):
            continue
        part = Path(mark[:-len(MARK_SUFFIX)])
        if part.is_file() and not part.is_symlink():
            part.unlink(missing_ok=True)
            removed.append(str(part))
            log.info("removed %s, left by a writer that died", part)
        Path(mark).unlink(missing_ok=True)
    return removed
