"""Read a tree lazily: the TOC once, then chunks on demand through the fetcher, verified
and kept in the node cache. Demand reads and prefetch share the fetcher, so a demand for
a chunk that prefetch has queued promotes it instead of fetching it twice."""

from __future__ import annotations

import functools
import logging
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING

from bootseer.errors import BlobNotFound, DigestMismatch
from bootseer.store.digest import verify
from bootseer.store.fetch import Fetcher, Lane, Priority, fetch_blob
from bootseer.store.source import BlobSource
from bootseer.tree import format as fmt
from bootseer.tree import toc_cache
from bootseer.tree.toc import ChunkRef, Entry, Toc

if TYPE_CHECKING:
    from bootseer.tree.hotpack import HotBlocks

log = logging.getLogger(__name__)

TYPE_BITS = {"f": stat.S_IFREG, "d": stat.S_IFDIR, "l": stat.S_IFLNK, "h": stat.S_IFREG,
             "c": stat.S_IFCHR, "b": stat.S_IFBLK, "p": stat.S_IFIFO}


def load_toc(store, digest: str, fetcher: Fetcher | Lane, cache=None) -> Toc:
    """The tree's TOC, verified (node cache first) and checked (``validate``); on a node
    cache, the node's decoded copy when it keeps one (:mod:`bootseer.tree.toc_cache`;
    a mount writes it once it is up)."""
    if cache is not None:
        toc = toc_cache.load(cache.root, digest)
        if toc is not None:
            return toc
        blob = cache.get(digest)
        if blob is None:
            blob = fetch_blob(fetcher, store, digest)
            cache.offer(digest, blob)
    else:
        blob = fetch_blob(fetcher, store, digest)
    return fmt.decode(blob, digest)


class TreeReader:
    def __init__(self, store, digest: str, fetcher: Fetcher | Lane, cache=None):
        self.store, self.digest, self.fetcher, self.cache = store, digest, fetcher, cache
        try:
            self.toc = load_toc(store, digest, fetcher, cache)
        except BlobNotFound:
            raise BlobNotFound(f"no tree {digest} in {store.url}: convert or publish it first",
                               digest=digest, url=store.url) from None
        self.packs = self.toc.packs
        self.entries: dict[str, Entry] = {e.path: e for e in self.toc.entries}
        self.children: dict[str, list[str]] = {}
        for p in self.entries:
            if p != "/":
                parent, name = p.rsplit("/", 1)
                self.children.setdefault(parent or "/", []).append(name)
        self._sources = [BlobSource(store, d) for d in self.packs]
        # access recorder hook: (chunk digest, path, bytes, was it local when read, and
        # the bytes lo:hi of the chunk the read wants)
        self.on_chunk: Callable[[str, str, int, bool, int, int | None], None] | None = None
        self._zd = threading.local()
        self.counters = {"chunks_local": 0, "chunks_fetched": 0, "bytes_fetched": 0,
                         "stall_s": 0.0}
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, bytes] = OrderedDict()   # verified, newest last
        self._fresh: OrderedDict[str, bytes] = OrderedDict()    # see keep_fresh
        self._fresh_wanted: set[str] = set()
        self._fresh_bytes = self._fresh_max = 0
        self._read_ahead_dirs: set[str] = set()
        # the blocks a hot pack brought (bootseer.tree.hotpack.HotBlocks), set by prefetch
        self.hot: HotBlocks | None = None

    # -- metadata -----------------------------------------------------------------------------
    def entry(self, path: str) -> Entry:
        """The entry at ``path``; a hard link's is its file's, under the link's path."""
        e = self.entries.get(path)
        if e is None:
            raise FileNotFoundError(f"{path}: not in tree {self.digest[:19]}")
        if e.type == "h":
            return replace(self.entries[e.target or ""], path=path)
        return e

    def mode(self, e: Entry) -> int:
        return TYPE_BITS[e.type] | e.mode

    def total_bytes(self) -> int:
        return sum(c.size for e in self.toc.files() for c in e.chunks or ())

    def all_chunks(self) -> list[ChunkRef]:
        return self.toc.distinct_chunks()

    # -- chunks -------------------------------------------------------------------------------
    def decode(self, data: bytes, ref: ChunkRef) -> bytes:
        """The chunk's uncompressed bytes from its stored ``data``, verified."""
        import zstandard
        zd = getattr(self._zd, "d", None)
        if zd is None:
            zd = self._zd.d = zstandard.ZstdDecompressor()
        try:
            out = zd.decompress(data, max_output_size=ref.size)
        except zstandard.ZstdError as e:
            raise DigestMismatch(f"chunk {ref.digest} in pack {self.packs[ref.pack]} does not "
                                 f"decompress: {e}", digest=ref.digest, url=self.store.url) from e
        verify(ref.digest, out, source=f"{self.store.url} pack {self.packs[ref.pack]}")
        return out

    def submit_chunk(self, ref: ChunkRef, priority: Priority) -> Future:
        return self.fetcher.submit(self._sources[ref.pack], ref.offset, ref.end,
                                   priority=priority)

    def submit_chunks(self, refs: list[ChunkRef], priority: Priority) -> list[Future]:
        return self.fetcher.submit_many([(self._sources[r.pack], r.offset, r.end)
                                         for r in refs], priority=priority)

    def has_chunk(self, ref: ChunkRef) -> bool:
        return self.cache is not None and self.cache.contains(ref.digest)

    # Kernel reads are often smaller than a chunk (128 KiB pieces of a 1 MiB chunk): the
    # last few chunks read stay in memory, verified, so each piece costs neither a re-read
    # of the cache file nor a re-hash, and nothing unverified is ever served.
    RECENT_CHUNKS = 8

    def _remember(self, digest: str, data: bytes) -> None:
        with self._lock:
            self._recent[digest] = data
            self._recent.move_to_end(digest)
            while len(self._recent) > self.RECENT_CHUNKS:
                self._recent.popitem(last=False)

    def keep_fresh(self, digests, max_bytes: int) -> None:
        """Keep these chunks in memory, verified, from the moment prefetch stores them
        until their first read (at most ``max_bytes``, oldest dropped first): the kernel
        path's pre-read reads each hot chunk right after the prefetch brought it, and then
        costs neither a re-read of the cache file nor a re-hash."""
        with self._lock:
            self._fresh_wanted, self._fresh_max = set(digests), max_bytes

    def _keep_if_wanted(self, digest: str, data: bytes) -> None:
        if digest not in self._fresh_wanted:
            return
        with self._lock:
            if digest in self._fresh:
                return
            self._fresh[digest] = data
            self._fresh_bytes += len(data)
            while self._fresh_bytes > self._fresh_max and self._fresh:
                self._fresh_bytes -= len(self._fresh.popitem(last=False)[1])

    def chunk(self, ref: ChunkRef, path: str = "", lo: int = 0, hi: int | None = None) -> bytes:
        """Uncompressed, verified bytes of one chunk (memory, then the node cache, whose
        entries are re-verified as they are read, then the store). ``lo:hi``: the part
        the caller wants, for the recorder (the whole chunk is returned)."""
        digest = ref.digest
        fresh = None
        with self._lock:
            data = self._recent.get(digest)
            if data is not None:
                self._recent.move_to_end(digest)
            elif self._fresh:
                fresh = data = self._fresh.pop(digest, None)
                if fresh is not None:
                    self._fresh_bytes -= len(fresh)
        if fresh is not None:
            self._remember(digest, fresh)
        if data is None and self.cache is not None:
            data = self.cache.get(digest, ref.size)   # None too when it was bad on disk
            if data is not None:
                self._remember(digest, data)
        if data is not None:
            with self._lock:
                self.counters["chunks_local"] += 1
            if self.on_chunk is not None:
                self.on_chunk(digest, path, ref.size, True, lo, hi)
            return data
        if self.on_chunk is not None:
            self.on_chunk(digest, path, ref.size, False, lo, hi)
        t0 = time.monotonic()
        fut = self.submit_chunk(ref, Priority.DEMAND)
        if path:
            self._read_ahead(path, ref)
        raw = fut.result()
        data = self.decode(raw, ref)
        with self._lock:
            self.counters["chunks_fetched"] += 1
            self.counters["bytes_fetched"] += len(raw)
            self.counters["stall_s"] += time.monotonic() - t0
        self._remember(digest, data)
        if self.cache is not None:   # a full cache only costs the caching
            self.cache.offer(digest, data, verified=True)   # decode verified it
        return data

    def part(self, ref: ChunkRef, path: str, lo: int, hi: int) -> bytes:
        """Bytes ``lo:hi`` of one chunk, verified: from the hot pack's blocks when they
        cover the range (each checked against the tree's block table), else from the
        whole chunk (``chunk``)."""
        hot = self.hot
        data = hot.get(ref, lo, hi) if hot is not None else None
        if data is None:
            return self.chunk(ref, path, lo, hi)[lo:hi]
        with self._lock:
            self.counters["chunks_local"] += 1
        if self.on_chunk is not None:
            self.on_chunk(ref.digest, path, ref.size, True, lo, hi)
        return data

    # Demand read-ahead: without a profile every miss is a round trip, and a Python import
    # reads a package's small files one by one. On the first miss in a directory, the
    # small files beside it are queued at PREFETCH priority (they sit next to each other in
    # the pack, so the fetcher coalesces them into few requests), and so are the next
    # chunks of the file being read. Demand reads still go first.
    READ_AHEAD_FILE_CHUNKS = 4
    READ_AHEAD_DIR_BYTES = 4 << 20
    READ_AHEAD_SMALL_FILE = 256 << 10

    def _read_ahead(self, path: str, ref: ChunkRef) -> None:
        if self.cache is None:
            return
        e = self.entries.get(path)
        refs: list[ChunkRef] = []
        if e is not None and e.chunks:
            chunks = e.chunks
            i = next((k for k, c in enumerate(chunks) if c.digest == ref.digest), None)
            if i is not None:
                refs += chunks[i + 1:i + 1 + self.READ_AHEAD_FILE_CHUNKS]
        parent = path.rsplit("/", 1)[0] or "/"
        with self._lock:
            first = parent not in self._read_ahead_dirs
            self._read_ahead_dirs.add(parent)
        if first:
            budget = self.READ_AHEAD_DIR_BYTES
            for name in self.children.get(parent, ()):
                sib = self.entries.get(f"{parent.rstrip('/')}/{name}")
                if sib is None or sib.type != "f" or sib.size > self.READ_AHEAD_SMALL_FILE:
                    continue
                refs += sib.chunks or ()
                budget -= sib.size
                if budget <= 0:
                    break
        todo = sorted((r for r in refs if not self.has_chunk(r)),
                      key=lambda c: (c.pack, c.offset))
        for r, fut in zip(todo, self.submit_chunks(todo, Priority.PREFETCH), strict=True):
            fut.add_done_callback(functools.partial(self._stash, r))

    def _stash(self, ref: ChunkRef, fut: Future) -> None:
        """A read-ahead chunk arrived: verify and cache it (errors only cost the hint)."""
        try:
            if not self.has_chunk(ref):
                self.store_chunk(ref, fut.result())
        except Exception as e:  # noqa: BLE001 - read-ahead never fails a read
            log.debug("read-ahead of %s failed: %s", ref.digest[:19], e)

    def store_chunk(self, ref: ChunkRef, raw: bytes) -> bytes:
        """Verify and cache a chunk fetched by prefetch; returns its verified bytes."""
        data = self.decode(raw, ref)
        self._keep_if_wanted(ref.digest, data)   # before the cache shows it as local
        if self.cache is not None:
            self.cache.offer(ref.digest, data, verified=True)   # decode verified it
        return data

    def read(self, path: str, size: int, offset: int) -> bytes:
        e = self.entry(path)
        if e.type != "f":
            raise IsADirectoryError(path) if e.type == "d" else OSError(22, "not a file", path)
        end = min(offset + size, e.size)
        if offset >= end:
            return b""
        csize = self.toc.chunk_size
        chunks = e.chunks or ()
        out = []
        for i in range(offset // csize, (end - 1) // csize + 1):
            ref, base = chunks[i], i * csize
            lo, hi = max(offset - base, 0), min(end - base, ref.size)
            out.append(self.part(ref, path, lo, hi))
        return b"".join(out)
