"""The node cache: verified blobs (and chunks) on local disk, shared by every bootseer
process on the node.

* bounded: a hard byte budget; least-recently-used entries are evicted, pinned ones never;
* verified: an entry is stored only if its bytes hash to its digest;
* crash-safe: written to a temp file and renamed, so a killed process never leaves a
  partial entry visible; leftover temp files are swept;
* multi-process: a locked file guards eviction; a per-digest lock file makes
  concurrent fills of one missing entry (threads or processes) fetch once (single-flight).

File locks are POSIX record locks (``lockf``), not ``flock``: a process forked while a
thread holds an flock (a FUSE server started by ``bootseer run``) would keep that lock
for its whole life through the inherited descriptor; record locks are not inherited.
They are per process, so a thread lock is taken first.

LRU clock: an entry's mtime, bumped on every hit. Pins: ``pins/<hex>.<pid>`` files; a pin
whose process is gone no longer counts.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from bootseer.config import CacheConfig
from bootseer.errors import CacheError, DigestMismatch
from bootseer.store.digest import Digest, hex_of, sha256_digest


class NodeCache:
    def __init__(self, config: CacheConfig | None = None):
        self.config = config or CacheConfig()
        self.root = Path(self.config.dir)
        self.budget = self.config.budget_bytes
        for sub in ("data", "pins", "locks"):
            try:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CacheError(f"cannot create node cache at {self.root}: {e}") from e
        self._thread_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._evict_tlock = threading.Lock()
        self._stats = dict(hits=0, misses=0, fills=0, evictions=0, bytes_in=0, rejected=0)

    # -- paths --------------------------------------------------------------------------------
    def _path(self, digest: Digest) -> Path:
        h = hex_of(digest)
        return self.root / "data" / h[:2] / h

    def path(self, digest: Digest) -> Path | None:
        p = self._path(digest)
        return p if p.exists() else None

    # -- reads --------------------------------------------------------------------------------
    def get(self, digest: Digest) -> bytes | None:
        p = self._path(digest)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            with self._guard:
                self._stats["misses"] += 1
            return None
        try:
            os.utime(p)
        except OSError:
            pass
        with self._guard:
            self._stats["hits"] += 1
        return data

    def touch(self, digest: Digest) -> None:
        """Mark an entry recently used (LRU) without reading it."""
        try:
            os.utime(self._path(digest))
        except OSError:
            pass
        with self._guard:
            self._stats["hits"] += 1

    def contains(self, digest: Digest) -> bool:
        return self._path(digest).exists()

    # -- writes -------------------------------------------------------------------------------
    def put(self, digest: Digest, data: bytes) -> None:
        actual = sha256_digest(data)
        if actual != digest:
            with self._guard:
                self._stats["rejected"] += 1
            raise DigestMismatch(f"not caching {digest}: the bytes hash to {actual}",
                                 digest=digest)
        final = self._path(digest)
        if final.exists():
            return
        if len(data) > self.budget:
            raise CacheError(f"entry {digest} of {len(data)} bytes exceeds the cache budget "
                             f"of {self.budget} bytes (cache.budget_bytes)", digest=digest)
        self._make_room(len(data))
        final.parent.mkdir(exist_ok=True)
        try:
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, final)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise CacheError(f"node cache {self.root} is out of disk space writing "
                                 f"{digest}; lower cache.budget_bytes", digest=digest) from e
            raise CacheError(f"cannot write {digest} to {self.root}: {e}", digest=digest) from e
        with self._guard:
            self._stats["bytes_in"] += len(data)

    def get_or_fill(self, digest: Digest, fill: Callable[[], bytes]) -> bytes:
        """The entry, filling it with ``fill()`` if missing; one fill per digest at a time
        across threads and processes."""
        data = self.get(digest)
        if data is not None:
            return data
        with self._guard:
            tlock = self._thread_locks.setdefault(digest, threading.Lock())
        with tlock:
            lock_path = self.root / "locks" / hex_of(digest)
            with open(lock_path, "a+") as lf:
                fcntl.lockf(lf, fcntl.LOCK_EX)
                try:
                    p = self._path(digest)
                    if p.exists():
                        return p.read_bytes()
                    data = fill()
                    with self._guard:
                        self._stats["fills"] += 1
                    self.put(digest, data)
                    return data
                finally:
                    fcntl.lockf(lf, fcntl.LOCK_UN)

    # -- pins and eviction --------------------------------------------------------------------
    def pin(self, digest: Digest) -> None:
        (self.root / "pins" / f"{hex_of(digest)}.{os.getpid()}").touch()

    def unpin(self, digest: Digest) -> None:
        try:
            (self.root / "pins" / f"{hex_of(digest)}.{os.getpid()}").unlink()
        except FileNotFoundError:
            pass

    def _pinned(self) -> set[str]:
        pinned = set()
        for p in (self.root / "pins").iterdir():
            h, _, pid = p.name.partition(".")
            if pid.isdigit() and os.path.exists(f"/proc/{pid}"):
                pinned.add(h)
            else:
                p.unlink(missing_ok=True)
        return pinned

    def _entries(self) -> list[tuple[float, int, Path]]:
        out = []
        now = time.time()
        for d in (self.root / "data").iterdir():
            for f in d.iterdir():
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                if f.name.startswith(".tmp-"):
                    if now - st.st_mtime > 3600:  # left by a killed process
                        f.unlink(missing_ok=True)
                    continue
                out.append((st.st_mtime, st.st_size, f))
        return out

    def _make_room(self, incoming: int) -> None:
        """Reserve ``incoming`` bytes under the budget, evicting LRU entries if needed.

        The bytes in use are kept in the eviction lock file, so a put costs one small read
        and write instead of a scan of every entry (thousands of chunks per image made each
        put O(n)). The figure only errs high (a put that fails after reserving, an entry
        deleted by hand): when it says the budget is full, a scan recomputes it exactly."""
        with self._evict_tlock:
            fd = os.open(self.root / ".evict.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                used = _read_usage(fd)
                if used is not None and used + incoming <= self.budget:
                    _write_usage(fd, used + incoming)
                    return
                used = self._evict_for(incoming)
                _write_usage(fd, used + incoming)
            finally:
                os.close(fd)  # releases the record lock

    def _evict_for(self, incoming: int) -> int:
        """Scan, evict least-recently-used unpinned entries until ``incoming`` fits; return
        the bytes left in use."""
        entries = self._entries()
        used = sum(size for _, size, _ in entries)
        if used + incoming <= self.budget:
            return used
        pinned = self._pinned()
        for _, size, f in sorted(entries):
            if used + incoming <= self.budget:
                break
            if f.name in pinned:
                continue
            f.unlink(missing_ok=True)
            used -= size
            with self._guard:
                self._stats["evictions"] += 1
        if used + incoming > self.budget:
            raise CacheError(f"node cache {self.root} cannot fit {incoming} bytes: "
                             f"{used} bytes are pinned or in use (budget {self.budget})")
        return used

    def stats(self) -> dict:
        entries = self._entries()
        with self._guard:
            return {**self._stats, "entries": len(entries),
                    "bytes": sum(s for _, s, _ in entries), "budget": self.budget}


def _read_usage(fd: int) -> int | None:
    raw = os.pread(fd, 32, 0).strip()
    return int(raw) if raw.isdigit() else None


def _write_usage(fd: int, used: int) -> None:
    data = f"{used:<31d}\n".encode()   # fixed width: no truncate needed
    os.pwrite(fd, data, 0)
