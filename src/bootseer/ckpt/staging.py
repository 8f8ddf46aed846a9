"""The node's local copy of checkpoint files, stripe by stripe.

Layout of a staging directory (one per node: ``<cache.dir>/../ckpt``)::

    <staging>/
      <name>             sparse file, the remote file's size; stripes written in place
      <name>.complete    every stripe is in <name> (written once, by whoever finishes)
      profiles-v1/       recorded access profiles (see ckpt/profile.py)

``<name>`` is derived from the remote file's identity (URL + size + mtime/ETag), so a new
version of a file never reads an old version's bytes. Which stripes of an incomplete file
are present is known only to the process that wrote them; another process trusts only the
``.complete`` marker (a killed writer may have left holes).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

from bootseer.errors import CacheError


def staged_name(key: str) -> str:
    """The staging file name of one remote file version (its source ``key``)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class StagingArea:
    """A staging directory; ``temporary()`` makes a private one removed by ``close``."""

    def __init__(self, directory: str | os.PathLike, *, owned: bool = False):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._owned = owned

    @classmethod
    def temporary(cls) -> "StagingArea":
        return cls(tempfile.mkdtemp(prefix="bootseer-ckpt-"), owned=True)

    def file(self, key: str, size: int, stripe_bytes: int) -> "StagedFile":
        return StagedFile(self, key, size, stripe_bytes)

    def is_complete(self, key: str) -> bool:
        return (self.dir / f"{staged_name(key)}.complete").exists()

    def path(self, key: str) -> Path:
        return self.dir / staged_name(key)

    def close(self) -> None:
        if self._owned:
            shutil.rmtree(self.dir, ignore_errors=True)


class StagedFile:
    """One remote file version's staging copy and the set of stripes it holds.

    Opens the file per call instead of holding a descriptor: a mount may touch thousands
    of files, and an open+close is noise next to a stripe's network time."""

    def __init__(self, area: StagingArea, key: str, size: int, stripe_bytes: int):
        self.area, self.key, self.size, self.stripe_bytes = area, key, size, stripe_bytes
        self.path = area.path(key)
        self.marker = self.path.with_name(self.path.name + ".complete")
        self.nstripes = (size + stripe_bytes - 1) // stripe_bytes
        self._lock = threading.Lock()
        self._done: set[int] = set(range(self.nstripes)) if self.marker.exists() else set()
        self._created = bool(self._done)
        if self.nstripes == 0 and not self.marker.exists():  # nothing to fetch: staged
            self.path.touch()
            self.marker.touch()
            self._created = True

    def span(self, idx: int) -> tuple[int, int]:
        return idx * self.stripe_bytes, min(self.size, (idx + 1) * self.stripe_bytes)

    def has(self, idx: int) -> bool:
        with self._lock:
            return idx in self._done

    def has_range(self, start: int, end: int) -> bool:
        with self._lock:
            return all(i in self._done for i in range(start // self.stripe_bytes,
                                                      (end - 1) // self.stripe_bytes + 1))

    @property
    def complete(self) -> bool:
        with self._lock:
            return len(self._done) == self.nstripes

    def write(self, idx: int, data: bytes) -> None:
        """Put stripe ``idx`` in place. Raises CacheError (staging disk full, unwritable)."""
        try:
            with self._lock:
                if not self._created:  # sparse: holes cost no disk until written
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
                    try:
                        os.ftruncate(fd, self.size)
                    finally:
                        os.close(fd)
                    self._created = True
            fd = os.open(self.path, os.O_WRONLY)
            try:
                view, pos = memoryview(data), idx * self.stripe_bytes
                while view:
                    n = os.pwrite(fd, view, pos)
                    view, pos = view[n:], pos + n
            finally:
                os.close(fd)
        except OSError as e:
            raise CacheError(f"cannot stage stripe {idx} of {self.key.split('|')[0]} in "
                             f"{self.area.dir}: {e}; free space there or set "
                             "BOOTSEER_CACHE_DIR elsewhere", offset=idx * self.stripe_bytes
                             ) from e
        with self._lock:
            self._done.add(idx)
            finished = len(self._done) == self.nstripes
        if finished:
            self.marker.touch()

    def pread(self, offset: int, n: int) -> bytes:
        """Staged bytes ``[offset, offset + n)`` as one new bytes object (one copy)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            parts = []
            while n > 0:
                b = os.pread(fd, n, offset)
                if not b:
                    break
                parts.append(b)
                offset, n = offset + len(b), n - len(b)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            os.close(fd)

    def readinto(self, offset: int, buf: memoryview) -> int:
        """Staged bytes at ``offset`` into ``buf`` (one copy, from the page cache)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            got = 0
            while got < len(buf):
                n = os.preadv(fd, [buf[got:]], offset + got)
                if n == 0:
                    break
                got += n
            return got
        finally:
            os.close(fd)


def node_staging_dir(config) -> Path:
    """The node's staging directory: next to the block cache (``<cache.dir>/../ckpt``)."""
    return Path(config.cache.dir).parent / "ckpt"
