"""Prefetch the hot chunks of a tree in recorded order, many requests in flight, at
PREFETCH priority (demand reads go first; a demanded chunk already queued is promoted,
never fetched twice). When the hot set is most of the image, pull everything eagerly in
pack order instead. Failures are logged and counted: prefetch never fails a job."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from bootseer.store.fetch import Priority
from bootseer.tree.peer_source import TreeChunks
from bootseer.tree.reader import TreeReader
from bootseer.tree.toc import ChunkRef

log = logging.getLogger(__name__)
EAGER_SHARE = 0.7


def _pack_order(c: ChunkRef) -> tuple[int, int]:
    return c.pack, c.offset


class Prefetcher:
    def __init__(self, reader: TreeReader, profile: dict | None, *, window: int = 512,
                 batch: int = 256, done_file: str | None = None, peers=None):
        self.reader, self.window, self.batch = reader, window, batch
        self.peers = peers   # a bootseer.peers.share.PeerShare: the job's nodes as a source
        self.done_file = done_file
        by_digest = {c.digest: c for c in reader.all_chunks()}
        hot = [by_digest[row[0]] for row in (profile or {}).get("chunks", []) if row[0] in by_digest]
        total = sum(c.size for c in by_digest.values()) or 1
        hot_bytes = sum(c.size for c in hot)
        self.eager = profile is not None and hot_bytes / total >= EAGER_SHARE
        self.plan = sorted(by_digest.values(), key=_pack_order) if self.eager else hot
        self.stats = {"planned_chunks": len(self.plan),
                      "planned_bytes": sum(c.size for c in self.plan),
                      "fetched_chunks": 0, "fetched_bytes": 0, "already_local": 0, "errors": 0,
                      "eager": self.eager, "seconds": 0.0, "origin_bytes": 0,
                      "peer_bytes": 0}
        self.prefetched: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._transfer = None

    def start(self) -> "Prefetcher":
        self._thread = threading.Thread(target=self._run, daemon=True, name="bootseer-prefetch")
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.monotonic()
        pending: deque = deque()
        plan = self.plan
        try:
            if self.peers is not None and self.peers.wants(self.stats["planned_bytes"]):
                # Peers first (each chunk verified as from the store); the origin gets what
                # they did not deliver. Demand reads go to the store meanwhile.
                chunks = TreeChunks(self.reader, self.plan)
                self._transfer = self.peers.open_set(chunks.items, chunks, self.stats)
                left = {i.digest for i in self._transfer.fetch(self._stop)}
                self.stats.update(self._transfer.summary())
                self.prefetched |= self._transfer.prefetched
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
                pending.extend(zip(todo, self.reader.submit_chunks(todo, Priority.PREFETCH)))
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
        except Exception as e:  # noqa: BLE001
            self.stats["errors"] += 1
            log.info("prefetch of chunk %s failed: %s", ref.digest[:19], e)
            if self.stats["errors"] > 20:
                raise

    def wait(self, timeout: float | None = None) -> None:
        if self._thread:
            self._thread.join(timeout)

    def stop(self) -> None:
        self._stop.set()
