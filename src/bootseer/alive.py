"""Liveness marks: a process holds a POSIX record lock on a small file for as long as it
lives; the kernel drops the lock when the process dies (SIGKILL and OOM included), so a
mark nobody holds was left by a dead process.

Whether a mark is held is read from ``/proc/locks``, never by trying to take the lock:
POSIX locks never conflict within one process, so a probe from the holder's own process
would succeed, and closing the probe would drop the holder's lock. Holders in other PID
namespaces are seen too (the lock is on the file).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path


class Mark:
    """A held mark at ``path`` (created); ``release`` drops and removes it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.lockf(self._fd, fcntl.LOCK_EX)

    @classmethod
    def new_in(cls, directory: str | os.PathLike) -> "Mark":
        """A mark with a fresh name in ``directory`` (one per holder, even within a
        process)."""
        os.makedirs(directory, exist_ok=True)
        fd, path = tempfile.mkstemp(dir=directory, prefix=f"{os.getpid()}-")
        os.close(fd)
        return cls(path)

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def held(path: str | os.PathLike) -> bool | None:
    """Whether a live process holds the mark at ``path`` (None: there is no such file)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if "->" in fields or len(fields) < 6:   # a waiter, not a holder
                    continue
                major, minor, ino = fields[5].split(":")
                if (int(major, 16), int(minor, 16), int(ino)) == want:
                    return True
    except (OSError, ValueError):
        return True   # cannot tell: treat as alive, never remove what may be in use
    return False
