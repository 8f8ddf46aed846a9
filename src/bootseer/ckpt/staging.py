"""The node's local copy of checkpoint files, stripe by stripe.

Layout of a staging directory (one per node: ``ckpt.staging_dir``, by default
``<cache.dir>/ckpt-staging``)::

    <staging>/
      .bootseer-ckpt-staging  made with the directory: ``gc`` trims no directory without it
      <name>             sparse file, the remote file's size; stripes written in place
      <name>.complete    every stripe is in <name> (written once, by whoever finishes)
      profiles-v1/       recorded access profiles (see ckpt/profile.py)
      .engines/<pid>-*   each live engine's mark (bootseer.node.alive; mtime: since when)
      .gc.lock           held shared while an engine takes up a file, exclusive by ``gc``

``<name>`` is derived from the remote file's identity (URL without credentials + size +
mtime/ETag), so a new version of a file never reads an old version's bytes. Which stripes
of an incomplete file are present is known only to the process that wrote them; another
process trusts only the ``.complete`` marker (a killed writer may have left holes).

Who may read a staged file (``ckpt.staging_mode``): ``auto`` makes the copy of a file read
with credentials (in its URL, BOOTSEER_CKPT_USERNAME/PASSWORD, netrc) private (0600, its
staged mirror folders 0700) and others readable by all (0644); ``private`` makes every
file private and the staging directory 0700; ``shared`` makes every file 0644.

Nothing else removes staged files, so ``bootseer ckpt gc`` keeps the directory under a
size: least recently used first (an engine touches a file when it takes it up), never a
file that a live engine may be using (touched since the oldest live engine registered) or
that a job holds as a hard link, and only in a directory bootseer made (its marker): an
engine may stage into a directory it is given, never trimmed.

Directories beside the cache directory (``<cache.dir>/../ckpt``,
``<cache.dir>/../bootseer-ckpt-staging``) could be a user's folder next to the cache: they
are no longer used, nor removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path

from bootseer.errors import CacheError
from bootseer.node import alive

MARKER = ".bootseer-ckpt-staging"


def _make_marked(directory: Path) -> None:
    """Make ``directory`` (and its parents) with the marker that lets ``gc`` trim it; one
    that exists is used as it is: marked only if bootseer made it."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.mkdir()
    except FileExistsError:
        if not directory.is_dir():
            raise
        return
    (directory / MARKER).write_text("made by bootseer: checkpoint staging copies, which "
                                    "`bootseer ckpt gc` may remove\n")


def staged_name(key: str) -> str:
    """The staging file name of one remote file version (its source ``key``)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class StagingArea:
    """A staging directory; ``temporary()`` makes a private one removed by ``close``."""

    def __init__(self, directory: str | os.PathLike, *, owned: bool = False,
                 mode: str = "auto"):
        self.dir = Path(directory)
        _make_marked(self.dir)
        self.mode = mode
        if mode == "private":
            os.chmod(self.dir, 0o700)
        self._owned = owned
        # an owned directory goes with its area even when nobody calls close (an engine a
        # caller dropped): at garbage collection or interpreter exit
        self._remove = (weakref.finalize(self, shutil.rmtree, str(self.dir), True)
                        if owned else None)
        self._mark: alive.Mark | None = None
        self._gc_fd: int | None = None
        self._gc_lock = threading.Lock()   # POSIX locks are per process: one taker at a time

    def register(self) -> None:
        """Say that a live engine of this process uses the directory (``gc`` then spares
        every file touched since); ``close`` takes it back, a dead process's is ignored."""
        if self._owned or self._mark is not None:
            return
        self._mark = alive.Mark.new_in(self.dir / ".engines")
        self._gc_fd = os.open(self.dir / ".gc.lock", os.O_RDWR | os.O_CREAT, 0o644)

    @classmethod
    def temporary(cls, mode: str = "auto") -> StagingArea:
        return cls(tempfile.mkdtemp(prefix="bootseer-ckpt-"), owned=True, mode=mode)

    def private_for(self, credentialed: bool) -> bool:
        """Whether what is staged from a source (read with credentials or not) is private."""
        return self.mode == "private" or (self.mode == "auto" and credentialed)

    def file(self, key: str, size: int, stripe_bytes: int, *, private: bool = False
             ) -> StagedFile:
        """``private``: the source carried credentials (see :meth:`private_for`)."""
        private = self.private_for(private)
        if self._gc_fd is None:
            return StagedFile(self, key, size, stripe_bytes, private=private)
        with self._gc_lock:   # gc never removes a file between our look and our touch
            fcntl.lockf(self._gc_fd, fcntl.LOCK_SH)
            try:
                f = StagedFile(self, key, size, stripe_bytes, private=private)
                try:
                    os.utime(f.path)   # recently used, and in use by a live engine
                except FileNotFoundError:
                    pass
                return f
            finally:
                fcntl.lockf(self._gc_fd, fcntl.LOCK_UN)

    def is_complete(self, key: str) -> bool:
        return (self.dir / f"{staged_name(key)}.complete").exists()

    def path(self, key: str) -> Path:
        return self.dir / staged_name(key)

    def close(self) -> None:
        if self._remove is not None:
            self._remove()
        if self._gc_fd is not None:
            os.close(self._gc_fd)
            self._gc_fd = None
        if self._mark is not None:
            self._mark.release()
            self._mark = None


class StagedFile:
    """One remote file version's staging copy and the set of stripes it holds.

    Opens the file per call instead of holding a descriptor: a mount may touch thousands
    of files, and an open+close is noise next to a stripe's network time."""

    def __init__(self, area: StagingArea, key: str, size: int, stripe_bytes: int, *,
                 private: bool = False):
        self.area, self.key, self.size, self.stripe_bytes = area, key, size, stripe_bytes
        self.file_mode = 0o600 if private else 0o644
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
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, self.file_mode)
                    try:
                        os.fchmod(fd, self.file_mode)   # not the umask's, nor a past run's
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
    """The node's staging directory: ``ckpt.staging_dir``, else ``ckpt-staging`` inside
    the node cache's directory (never a user's folder beside it)."""
    return Path(config.ckpt.staging_dir or Path(config.cache.dir) / "ckpt-staging")


def _live_since(directory: Path) -> float | None:
    """When the oldest live engine registered (None: no live engine); removes the entries
    of dead processes."""
    oldest = None
    try:
        entries = list((directory / ".engines").iterdir())
    except FileNotFoundError:
        return None
    for e in entries:
        if e.name.startswith("."):   # a mark being made (bootseer.node.alive: named once locked)
            try:
                if alive.held(e) is False and time.time() - e.stat().st_mtime > 60:
                    e.unlink(missing_ok=True)   # its maker died before naming it
            except FileNotFoundError:
                pass
            continue
        if alive.held(e) is False:
            e.unlink(missing_ok=True)   # a dead engine's
            continue
        try:
            since = e.stat().st_mtime
        except FileNotFoundError:
            continue
        oldest = since if oldest is None else min(oldest, since)
    return oldest


STAGED = re.compile(r"[0-9a-f]{32}")


def gc(directory: str | os.PathLike, max_bytes: int, *, dry_run: bool = False
       ) -> list[tuple[str, int, float, str]]:
    """Remove least recently used staged files until the rest use at most ``max_bytes``
    of disk. Returns ``(name, bytes on disk, last use, action)`` for every staged file."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    if not (directory / MARKER).is_file():
        raise CacheError(f"{directory} has no {MARKER} marker: bootseer did not make it, so "
                         "it removes nothing from it")
    fd = os.open(directory / ".gc.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)   # no engine takes up a file meanwhile
        live = _live_since(directory)
        files = []
        for p in directory.iterdir():
            if STAGED.fullmatch(p.name) and p.is_file():
                st = p.stat()
                files.append((st.st_mtime, p, st.st_blocks * 512, st.st_nlink))
        files.sort()
        total = sum(f[2] for f in files)
        report = []
        for mtime, p, used, links in files:
            if total <= max_bytes:
                action = "kept"
            elif live is not None and mtime >= live:
                action = "in use (a live engine may read it)"
            elif links > 1:
                action = "in use (a job holds it as a hard link)"
            else:
                action = "would remove" if dry_run else "removed"
                if not dry_run:   # the marker first: nobody trusts a file half gone
                    p.with_name(p.name + ".complete").unlink(missing_ok=True)
                    p.unlink(missing_ok=True)
                total -= used
            report.append((p.name, used, mtime, action))
        return report
    finally:
        os.close(fd)

