"""The node cache: verified blobs (and chunks) on local disk, shared by every bootseer
process on the node.

* bounded: a hard byte budget; least-recently-used entries are evicted, pinned ones never;
* verified: an entry is stored only if its bytes hash to its digest;
* crash-safe: written to a temp file and renamed, so a killed process never leaves a
  partial entry visible; leftover temp files are swept;
* multi-process: a locked file guards eviction; two processes filling one entry at once
  is harmless (both hold verified bytes, the first rename wins, the second is dropped), so
  there is no per-entry lock: within a process the fetcher already reads a range once, and
  a lock held across each chunk's fetch would serialize the fetcher's batched reads.

File locks are POSIX record locks (``lockf``), not ``flock``: a process forked while a
thread holds an flock (a FUSE server started by ``bootseer run``) would keep that lock
for its whole life through the inherited descriptor; record locks are not inherited.
They are per process, so a thread lock is taken first.

LRU clock: an entry's mtime, bumped on every hit. Pins: ``pins/<hex>.<pid>`` files; a pin
whose process is gone no longer counts.

Re-verified on every read: a disk or a hand can corrupt or truncate an entry after it was
filled, so ``get`` checks the length and the digest and drops a bad entry, which the caller
then refetches. sha256 of a 1 MiB chunk costs about what its zstd decompression does (0.6
ms); readers keep a few verified chunks in memory so kernel-sized reads hash each once.
A cache that cannot take an entry (disk full, budget smaller than the entry, all pinned)
costs only the caching: ``offer`` logs it once and the verified bytes are served uncached.
Files in ``data/`` and ``pins/`` that bootseer did not name are skipped, logged, kept.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bootseer.config import CacheConfig
from bootseer.errors import CacheError, DigestMismatch
from bootseer.store.digest import Digest, hex_of, sha256_digest

log = logging.getLogger(__name__)
_ENTRY = re.compile(r"[0-9a-f]{64}")
_PIN = re.compile(r"([0-9a-f]{64})\.([0-9]+)")


class NodeCache:
    def __init__(self, config: CacheConfig | None = None):
        self.config = config or CacheConfig()
        self.root = Path(self.config.dir)
        self.budget = self.config.budget_bytes
        for sub in ("data", "pins"):
            try:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CacheError(f"cannot create node cache at {self.root}: {e}") from e
        self._guard = threading.Lock()
        self._evict_tlock = threading.Lock()
        self._stats = {"hits": 0, "misses": 0, "evictions": 0, "bytes_in": 0, "rejected": 0,
                       "corrupt": 0, "uncached": 0}
        self._logged: set[str] = set()   # what was said once already (foreign files, full)

    # -- paths --------------------------------------------------------------------------------
    def _path(self, digest: Digest) -> Path:
        h = hex_of(digest)
        return self.root / "data" / h[:2] / h

    def path(self, digest: Digest) -> Path | None:
        p = self._path(digest)
        return p if p.exists() else None

    # -- reads --------------------------------------------------------------------------------
    def get(self, digest: Digest, size: int | None = None) -> bytes | None:
        """The entry's bytes, verified (``size``: the length it must have), or None when it
        is missing or was bad on disk (then it is dropped: the caller refetches it)."""
        p = self._path(digest)
        data = self._read_verified(p, digest, size)
        if data is None:
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

    def _read_verified(self, p: Path, digest: Digest, size: int | None) -> bytes | None:
        try:
            data = p.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        if size is not None and len(data) != size:
            why = f"{len(data)} bytes, expected {size}"
        else:
            actual = sha256_digest(data)
            if actual == digest:
                return data
            why = f"its {len(data)} bytes hash to {actual}"
        log.warning("node cache entry %s is corrupt on disk (%s): dropped, fetching it again",
                    digest, why)
        with self._guard:
            self._stats["corrupt"] += 1
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        return None

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
    def put(self, digest: Digest, data: bytes, *, verified: bool = False) -> None:
        """Cache ``data`` under ``digest``; ``verified``: the caller hashed these very
        bytes to ``digest`` just before (a second sha256 costs ~3 ms per MiB here)."""
        actual = digest if verified else sha256_digest(data)
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
        try:
            final.parent.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                # reserved and renamed under one lock: a scan never misses bytes in flight
                self._make_room(len(data), place=lambda: _place(tmp, final))
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except CacheError:
            raise
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise CacheError(f"node cache {self.root} is out of disk space writing "
                                 f"{digest}; lower cache.budget_bytes", digest=digest) from e
            raise CacheError(f"cannot write {digest} to {self.root}: {e}", digest=digest) from e
        with self._guard:
            self._stats["bytes_in"] += len(data)

    def offer(self, digest: Digest, data: bytes, *, verified: bool = False) -> bool:
        """``put``, except that a cache unable to take the entry (disk full, an entry over
        the budget, everything pinned) is logged once and the caller serves its verified
        bytes uncached. Returns whether the entry is cached. Corrupt bytes still raise."""
        try:
            self.put(digest, data, verified=verified)
            return True
        except DigestMismatch:
            raise
        except CacheError as e:
            with self._guard:
                self._stats["uncached"] += 1
            self._log_once("uncached", "serving uncached: %s (further entries the cache "
                           "cannot take are served uncached without a log line)", e)
            return False

    def _log_once(self, key: str, msg: str, *args: object) -> None:
        with self._guard:
            if key in self._logged:
                return
            self._logged.add(key)
        log.warning(msg, *args)

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
            m = _PIN.fullmatch(p.name)
            if m is None or not p.is_file():
                self._foreign(p)
            elif os.path.exists(f"/proc/{m.group(2)}"):
                pinned.add(m.group(1))
            else:
                p.unlink(missing_ok=True)   # its process is gone
        return pinned

    def _foreign(self, p: Path) -> None:
        """Not a name bootseer gives: never counted, evicted or removed."""
        self._log_once(f"foreign:{p}", "node cache: skipping %s, which bootseer did not "
                       "make (remove it by hand if it is not needed)", p)

    def _entries(self) -> list[tuple[float, int, Path]]:
        out = []
        now = time.time()
        for d in (self.root / "data").iterdir():
            if len(d.name) != 2 or not d.is_dir() or d.is_symlink():
                self._foreign(d)
                continue
            for f in d.iterdir():
                try:
                    st = f.lstat()
                except FileNotFoundError:
                    continue
                if f.name.startswith(".tmp-") and stat.S_ISREG(st.st_mode):
                    if now - st.st_mtime > 3600:  # left by a killed process
                        f.unlink(missing_ok=True)
                    continue
                if not (_ENTRY.fullmatch(f.name) and f.name[:2] == d.name
                        and stat.S_ISREG(st.st_mode)):
                    self._foreign(f)
                    continue
                out.append((st.st_mtime, st.st_size, f))
        return out

    def _make_room(self, incoming: int, place: Callable[[], bool]) -> None:
        """Reserve ``incoming`` bytes under the budget, evicting LRU entries if needed, and
        ``place()`` the entry while the lock is held (it returns False when the entry was
        there already: nothing is reserved then).

        The bytes in use are kept in the eviction lock file, so a put costs one small read
        and write instead of a scan of every entry (thousands of chunks per image made each
        put O(n)). The figure only errs high (a put that fails after reserving, an entry
        deleted by hand): when it says the budget is full, a scan recomputes it exactly."""
        with self._evict_tlock:
            fd = os.open(self.root / ".evict.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                used = _read_usage(fd)
                if used is None or used + incoming > self.budget:
                    used = self._evict_for(incoming)
                _write_usage(fd, used + (incoming if place() else 0))
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

    def stats(self) -> dict[str, int]:
        entries = self._entries()
        with self._guard:
            return {**self._stats, "entries": len(entries),
                    "bytes": sum(s for _, s, _ in entries), "budget": self.budget}


def _place(tmp: str, final: Path) -> bool:
    """Rename a written entry into place; False when another filler placed it first."""
    if final.exists():
        return False
    os.replace(tmp, final)
    return True


def _read_usage(fd: int) -> int | None:
    raw = os.pread(fd, 32, 0).strip()
    return int(raw) if raw.isdigit() else None


def _write_usage(fd: int, used: int) -> None:
    data = f"{used:<31d}\n".encode()   # fixed width: no truncate needed
    os.pwrite(fd, data, 0)
