"""Prefetch the hot chunks of a tree in recorded order, many requests in flight, at
PREFETCH priority (demand reads go first; a demanded chunk already queued is promoted,
never fetched twice). When the profile names a hot pack (:mod:`bootseer.tree.hotpack`)
and the tree has a block table, the pack comes first: its verified blocks serve the
reads they cover, and only hot chunks it does not cover are fetched whole. When the hot
set is most of the image, pull everything eagerly in pack order instead. Failures are
logged and counted: prefetch never fails a job."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from bootseer.node import partfile
from bootseer.store.fetch import Priority
from bootseer.tree import hotpack
from bootseer.tree.peer_source import TreeChunks
from bootseer.tree.reader import TreeReader
from bootseer.tree.toc import ChunkRef

if TYPE_CHECKING:   # the transfer imports libtorrent, an optional extra
    from bootseer.peers.transfer import SetTransfer

log = logging.getLogger(__name__)
EAGER_SHARE = 0.7


def _pack_order(c: ChunkRef) -> tuple[int, int]:
    return c.pack, c.offset


class Prefetcher:
    def __init__(self, reader: TreeReader, profile: dict | None, *, window: int = 512,
                 batch: int = 256, done_file: str | None = None, peers=None,
                 pack_file: str | None = None, use_pack: bool = True):
        self.reader, self.window, self.batch = reader, window, batch
        self.peers = peers   # a bootseer.peers.share.PeerShare: the job's nodes as a source
        self.done_file = done_file
        # where the hot pack's covered blocks are written for the pre-read (digest -> blocks)
        self.pack_file = pack_file
        # ``use_pack`` False: whole chunks only (a node cache warmed ahead of any start,
        # whose mount then finds every hot chunk local)
        self.profile = profile if use_pack else None
        by_digest = {c.digest: c for c in reader.all_chunks()}
        hot = [by_digest[row[0]] for row in (profile or {}).get("chunks", [])
               if row[0] in by_digest]
        total = sum(c.size for c in by_digest.values()) or 1
        hot_bytes = sum(c.size for c in hot)
        self.eager = profile is not None and hot_bytes / total >= EAGER_SHARE
        self.plan = sorted(by_digest.values(), key=_pack_order) if self.eager else hot
        self.stats = {"planned_chunks": len(self.plan),
                      "planned_bytes": sum(c.size for c in self.plan),
                      "fetched_chunks": 0, "fetched_bytes": 0, "already_local": 0, "errors": 0,
                      "eager": self.eager, "seconds": 0.0, "origin_bytes": 0,
                      "peer_bytes": 0, "pack_bytes": 0, "pack_blocks": 0,
                      "pack_dropped_blocks": 0}
        self.prefetched: set[str] = set()   # chunks fetched whole
        self.packed: dict[str, frozenset[int]] = {}   # blocks the hot pack brought, per chunk
        self.pack_block_size = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._transfer: SetTransfer | None = None

    def start(self) -> Prefetcher:
        self._thread = threading.Thread(target=self._run, daemon=True, name="bootseer-prefetch")
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.monotonic()
        pending: deque = deque()
        plan = self.plan
        try:
            if not self.eager and self.profile and self.profile.get("pack"):
                plan = self.plan = self._hot_pack()
            if self.peers is not None and self.peers.wants(self.stats["planned_bytes"]):
                # Peers first (each chunk verified as from the store); the origin gets what
                # they did not deliver. Demand reads go to the store meanwhile.
                chunks = TreeChunks(self.reader, self.plan)
                transfer = self._transfer = self.peers.open_set(chunks.items, chunks,
                                                                self.stats)
                left = {i.digest for i in transfer.fetch(self._stop)}
                self.stats.update(transfer.summary())
                self.prefetched |= transfer.prefetched
                plan = [r for r in self.plan if r.digest in left]
            # Batches of the plan in recorded order, each submitted in pack order: the
            # fetcher then coalesces neighbours (small files are one small chunk each, and
            # one request per chunk costs the store more than the bytes do). Batches grow
            # from 8 chunks, so the first-read chunks still come first.
            i, size = 0, 8
            while i < len(plan):
                if self._stop.is_set():
                    break
                todo = []
                batch, i, size = plan[i:i + size], i + size, min(size * 2, self.batch)
                for ref in batch:
                    if self.reader.has_chunk(ref):
                        self.stats["already_local"] += 1
                    else:
                        todo.append(ref)
                todo.sort(key=_pack_order)
                pending.extend(zip(todo, self.reader.submit_chunks(todo, Priority.PREFETCH),
                                   strict=True))
                while len(pending) >= self.window:
                    self._complete(*pending.popleft())
            while pending:
                self._complete(*pending.popleft())
            if self._transfer is not None:
                self._transfer.finish()   # seed the set (the first node publishes it)
        except Exception as e:  # noqa: BLE001 - prefetch never fails the job
            log.warning("prefetch stopped: %s", e)
            self.stats["errors"] += 1
        self.stats["seconds"] = time.monotonic() - t0
        if self.done_file:
            open(self.done_file, "a").close()

    def _hot_pack(self) -> list[ChunkRef]:
        """Bring the profile's hot pack; the plan left for whole chunks (all of it when
        the pack cannot be used: the chunk path serves, as without one)."""
        try:
            got = hotpack.fetch(self.reader, self.profile or {})
        except Exception as e:  # noqa: BLE001 - a bad pack costs only its bytes
            log.warning("hot pack of tree %s not used: %s", self.reader.digest[:19], e)
            self.stats["errors"] += 1
            return self.plan
        if got is None:
            return self.plan
        hot, covered, dropped = got
        self.reader.hot = hot
        self.packed = {d: frozenset(b) for d, b in hot.kept.items()}
        self.pack_block_size = hot.table.block_size
        pack = (self.profile or {})["pack"]
        self.stats.update(pack_bytes=pack.get("bytes", 0), pack_dropped_blocks=dropped,
                          pack_blocks=sum(len(b) for b in hot.kept.values()))
        if dropped:
            log.warning("hot pack %s: %d blocks failed their block digests and were dropped "
                        "(their chunks are fetched instead)", pack["digest"][:19], dropped)
        if self.pack_file:
            partfile.write_atomic(self.pack_file, json.dumps(
                {d: sorted(b) for d, b in covered.items()}).encode())
        plan = [c for c in self.plan if c.digest not in covered]
        self.stats.update(planned_chunks=len(plan),
                          planned_bytes=sum(c.size for c in plan) + pack.get("bytes", 0))
        return plan

    def _complete(self, ref: ChunkRef, fut) -> None:
        try:
            raw = fut.result()
            data = self.reader.store_chunk(ref, raw)
            self.prefetched.add(ref.digest)
            self.stats["fetched_chunks"] += 1
            self.stats["fetched_bytes"] += ref.size
            self.stats["origin_bytes"] += len(raw)
            if self._transfer is not None:
                self._transfer.offer(ref.digest, data)
        except Exception as e:
            self.stats["errors"] += 1
            log.info("prefetch of chunk %s failed: %s", ref.digest[:19], e)
            if self.stats["errors"] > 20:
                raise

    def precision(self, read: dict[str, set[int]], block: int) -> float | None:
        """The share of the prefetched bytes the start read, at the granularity they were
        fetched: a whole chunk counts when any of it was read, a pack block when a read
        touched it. ``read``: the blocks read per chunk digest, in ``block``-byte units (a
        chunk named with no blocks: read whole). None when nothing was prefetched."""
        sizes = {c.digest: c.size for c in self.reader.all_chunks()}
        # a copy: the prefetch may still be adding (set() copies without running Python)
        whole = set(self.prefetched)
        fetched = sum(sizes.get(d, 0) for d in whole)
        used = sum(sizes.get(d, 0) for d in whole if d in read)
        bs = self.pack_block_size
        for d, kept in self.packed.items():
            size, mine = sizes.get(d, 0), read.get(d)
            for b in kept:
                lo, hi = b * bs, min((b + 1) * bs, size)
                if hi <= lo:
                    continue
                fetched += hi - lo
                if mine is not None and (not mine or any(
                        r in mine for r in range(lo // block, (hi - 1) // block + 1))):
                    used += hi - lo
        return used / fetched if fetched else None

    def wait(self, timeout: float | None = None) -> None:
        if self._thread:
            self._thread.join(timeout)

    def stop(self) -> None:
        self._stop.set()
