"""Writing to a path the user named (``-o FILE``, ``--summary FILE``, ``--html FILE``...).

Temp file + rename is for files bootseer owns. A path the user names is not ours: renaming
over it would replace a device (``-o /dev/null`` as root), a FIFO or a symlink with a
regular file, and change an existing file's owner, mode and hard links. So an output is
opened and written in place, as the shell's ``>`` does:

* a missing path is created (mode 0666 less the umask);
* an existing regular file is truncated and rewritten (same inode, owner and mode);
* a character device (``/dev/null``, a terminal) or a FIFO is written to, never replaced;
* a symlink is followed, and its target obeys the rules above (``cat > link`` does so);
* anything else (a directory, a block device, a socket) is refused with one error line.

The type is checked on the opened descriptor (``fstat``), not on the name, so a path
swapped between a check and the open is still never truncated when it is not a file.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import IO, Any

from bootseer.errors import BootseerError


class OutputError(BootseerError, OSError):
    """An output path that cannot be written (refused, or the write failed)."""

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


_STREAMS = (stat.S_ISCHR, stat.S_ISFIFO)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check(path: str | os.PathLike[str], what: str = "output") -> None:
    """Refuse early (before any work) an output path that :func:`open_output` would refuse:
    an existing non-file, or a missing path whose directory does not exist."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise OutputError(f"cannot write {what} {path}: directory {parent} does not "
                              "exist") from None
        return
    except OSError as e:
        raise OutputError(f"cannot write {what} {path}: {e.strerror}") from e
    if not (stat.S_ISREG(st.st_mode) or any(t(st.st_mode) for t in _STREAMS)):
        raise OutputError(f"refusing to write {what} {path}: it is {_kind(st.st_mode)} "
                          "(name a regular file, a new path, a FIFO or /dev/null)")


def open_fd(path: str | os.PathLike[str], what: str = "output") -> int:
    """A write descriptor on ``path`` by the rules of this module (regular files truncated)."""
    path = os.fspath(path)
    try:
        # no O_TRUNC here: whether to truncate depends on what the descriptor turns out to be
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except IsADirectoryError:
        raise OutputError(f"refusing to write {what} {path}: it is a directory") from None
    except OSError as e:
        raise OutputError(f"cannot write {what} {path}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            os.ftruncate(fd, 0)
        elif not any(t(st.st_mode) for t in _STREAMS):
            raise OutputError(f"refusing to write {what} {path}: it is {_kind(st.st_mode)}")
    except OSError as e:
        os.close(fd)
        if isinstance(e, OutputError):
            raise
        raise OutputError(f"cannot write {what} {path}: {e.strerror}") from e
    return fd


@contextlib.contextmanager
def open_output(path: str | os.PathLike[str], mode: str = "w", what: str = "output"
                ) -> Iterator[IO[Any]]:
    """``open(path, mode)`` by the rules of this module (``mode``: ``"w"`` or ``"wb"``);
    a failed write raises OutputError naming the path."""
    if mode not in ("w", "wb"):
        raise ValueError(f"open_output writes only ('w' or 'wb'), not {mode!r}")
    fd = open_fd(path, what)
    f = os.fdopen(fd, mode)
    try:
        yield f
        f.close()
    except OSError as e:
        with contextlib.suppress(OSError):
            f.close()
        if isinstance(e, BootseerError):
            raise
        raise OutputError(f"cannot write {what} {os.fspath(path)}: {e.strerror or e}") from e
    finally:
        if not f.closed:
            with contextlib.suppress(OSError):
                f.close()


def write_text(path: str | os.PathLike[str], text: str, what: str = "output") -> None:
    with open_output(path, "w", what) as f:
        f.write(text)


def write_bytes(path: str | os.PathLike[str], data: bytes, what: str = "output") -> None:
    with open_output(path, "wb", what) as f:
        f.write(data)


def is_stream(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is (or links to) a character device or FIFO: bytes written there
    cannot be taken back, so a verified copy streams to it instead of spooling first."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return any(t(mode) for t in _STREAMS)


def spool_beside(path: str | os.PathLike[str]) -> IO[bytes]:
    """An anonymous temp file (no name: nothing is left behind if killed) on the output's
    filesystem, where bytes wait until verified before :func:`copy_into` writes them out."""
    parent = os.path.dirname(os.path.abspath(os.fspath(path)))
    try:
        return open(os.open(parent, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600), "w+b")
    except OSError:   # no O_TMPFILE on this filesystem: an unlinked named temp file
        import tempfile
        try:
            return tempfile.TemporaryFile(dir=parent)
        except OSError:
            return tempfile.TemporaryFile()


def copy_into(src: IO[bytes], path: str | os.PathLike[str], what: str = "output") -> None:
    """Write all of ``src`` (from its start) into ``path`` by the rules of this module."""
    src.flush()
    src.seek(0)
    with open_output(path, "wb", what) as out:
        out.flush()
        size = os.fstat(src.fileno()).st_size
        done = 0
        try:   # in-kernel copy (a reflink on filesystems that have them)
            while done < size:
                n = os.copy_file_range(src.fileno(), out.fileno(), size - done)
                if n == 0:
                    break
                done += n
        except OSError:
            pass
        if done < size:
            src.seek(done)
            while chunk := src.read(1 << 20):
                out.write(chunk)


__all__ = ["OutputError", "check", "open_fd", "open_output", "write_text", "write_bytes",
           "is_stream", "spool_beside", "copy_into"]
