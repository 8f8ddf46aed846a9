"""An environment's blob served while it is filled: the lazy restore's single-file view
(``/blob``, mounted by ``fillsrv`` and read by EROFS with O_DIRECT), written into a part
of ``<cache>/erofs/<layout>.blob`` as its chunks arrive, and renamed into place, verified,
with the node's record once every chunk is there, so the next restore on the node is the
local kernel mount.

Why demand reads never wait behind the fill: an importing process reads one chunk at a
time, so every stall adds up. A demand read that joins a background read of the same
range waits for that read's whole coalesced request (megabytes of neighbours, on a
connection already shared), and a promoted queued one drags its queued neighbours into
its request: so demand reads name the packs under a key of their own (``_DemandSource``)
and the fetcher neither merges nor coalesces them with the fill's (a chunk then arrives
twice at worst). They go through a lane with a reserve of connections only DEMAND reads
may use (``Policy.demand_reserve``); the fill through a second lane of a few connections
and small requests, and it submits nothing new while a demand read waits. The chunks one
kernel read spans are requested at once, not one by one.

Why a demand read has the link to itself: its bytes arrive at the rate of the
connections carrying them. A whole chunk in one request on one connection, beside the
fill's connections busy on the same link, got one share of it (1 MiB at a fifth of
1 Gbit/s is 42 ms, against 8 ms alone). So the fill's lane yields
(``Policy.yields_to_demand``): none of its queued reads starts while a demand read of the
store is in flight, and its requests are small (``FILL_REQUEST_BYTES``), so the few
already in flight end soon; a demanded chunk goes out as parts of ``DEMAND_PART_BYTES``
on as many connections at once (the demand lane coalesces no further), which a store
capping each connection's rate serves in parallel. The fill keeps at most
``FILL_WINDOW_BYTES`` queued, so a chunk both fetch is fetched twice rarely.

The fill fetches the recorded profile's chunks first, in recorded order, then the rest in
blob order. Every chunk is decompressed and checked against its digest before a byte of it
is written or served: one that fails is never served (the read fails with EIO) and the
blob is never completed (the part is removed at exit; the next ensure fetches it again).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, replace

from bootseer.config import BootseerConfig
from bootseer.deps import blobs
from bootseer.mount.erofs import BLOB_NAME
from bootseer.node import partfile
from bootseer.store.client import StoreClient
from bootseer.store.fetch import Policy, Priority
from bootseer.store.source import BlobSource
from bootseer.tree.blob import BlobLayout, BlobView
from bootseer.tree.reader import TreeReader
from bootseer.tree.toc import ChunkRef

log = logging.getLogger(__name__)
PREFETCH, BACKGROUND = Priority.PREFETCH, Priority.BACKGROUND
FILL_CONNECTIONS = 4          # the fill's requests in flight: enough to fill the link
FILL_REQUEST_BYTES = 256 << 10   # one fill request at most: the fill runs on all its connections
FILL_WINDOW_BYTES = 4 << 20   # fill bytes queued or in flight (at least one chunk)
DEMAND_PART_BYTES = 256 << 10    # one demand request at most: a chunk's parts run in parallel
RECORD_WAIT_S = 60.0          # for the restore to write the node record beside the mount
FIGURES = "fill.json"         # the fill's figures, in the mount's state directory
DEMAND_RESERVE = 4            # connections per host only demand reads may use


class _DemandSource(BlobSource):
    """A pack as demand reads name it: a key of its own, so the fetcher never joins them
    to the fill's reads of the same ranges nor coalesces them with the fill's."""

    def __init__(self, backend, digest):
        super().__init__(backend, digest)
        self.key = f"{digest}#demand"


@dataclass(frozen=True, slots=True)
class Fill:
    """What the filling server needs (pickled into its process)."""
    tree: str
    key: str
    """The environment's key (the node record's)."""
    layout: str
    """The blob layout's key: the server refuses a tree whose layout differs."""
    blob: str
    """Where the complete blob goes (``<cache>/erofs/<layout>.blob``)."""
    record: str
    """A JSON file the restore writes once the mount is made: the node record written
    with the blob (``blobs.remember``: tree, meta, relocated)."""
    hot: tuple[str, ...] = ()
    """The recorded profile's chunk digests, in recorded order: fetched first."""


class FillingBlob(BlobView):
    """The blob as ``/blob``: slots already written are read from the part, the others
    fetched on demand (verified, written, then served)."""

    def __init__(self, config: BootseerConfig, fill: Fill, *, start: bool = True):
        client = StoreClient.of(config)
        self.config, self.fill = config, fill
        base = Policy.of(config.fetch)
        demand = client.lane(replace(base, demand_reserve=DEMAND_RESERVE,
                                     part_bytes=DEMAND_PART_BYTES,
                                     max_coalesced_bytes=DEMAND_PART_BYTES))
        reader = TreeReader(client.store(), fill.tree, demand, client.cache)
        layout = BlobLayout(reader.toc)
        if layout.key != fill.layout:
            raise ValueError(f"blob layout {layout.key[:12]} differs from the restore's "
                             f"{fill.layout[:12]}")
        super().__init__(reader, layout)
        self._demand = demand
        self._sources = [_DemandSource(reader.store, d) for d in reader.packs]
        self._fill_sources = [BlobSource(reader.store, d) for d in reader.packs]
        self._asked = threading.local()
        self._fill_lane = client.lane(replace(
            base, max_inflight=FILL_CONNECTIONS, connections_per_host=FILL_CONNECTIONS,
            max_coalesced_bytes=FILL_REQUEST_BYTES, part_bytes=FILL_REQUEST_BYTES,
            yields_to_demand=True))
        self._slot = {ref.digest: i for i, ref in enumerate(layout.refs)}
        self._have = bytearray(len(layout.refs))
        self._left = len(layout.refs)
        self._lock = threading.Lock()
        self._demanding = 0
        self._decoding: dict[int, Future] = {}
        self._calm = threading.Condition(self._lock)
        self.stats = {"demand_chunks": 0, "demand_s": 0.0, "filled_chunks": 0,
                      "hot_chunks": len(fill.hot), "errors": 0, "complete": False}
        partfile.sweep_dead(os.path.dirname(fill.blob))   # a killed fill's part
        self._part: partfile.PartFile | None = partfile.PartFile(fill.blob)
        os.ftruncate(self._part.fd, layout.size)   # the padding reads as zeros
        self._rfd = os.open(self._part.path, os.O_RDONLY | os.O_CLOEXEC)
        self._stop = threading.Event()
        self.done = threading.Event()
        if start:
            threading.Thread(target=self._run_fill, daemon=True, name="bootseer-fill").start()

    # -- serving ------------------------------------------------------------------------------
    def read(self, path: str, size: int, offset: int) -> bytes:
        lay = self.layout
        first, last = lay.locate(offset), lay.locate(max(offset, min(offset + size, lay.size) - 1))
        missing = [lay.refs[i] for i in range(first, last + 1) if not self._have[i]]
        self._asked.futures = self._submit(missing) if missing else {}
        return super().read(path, size, offset)

    def _submit(self, refs: list[ChunkRef]) -> dict[str, list[Future]]:
        """Every part of these chunks queued at once, as DEMAND reads: their futures by
        chunk digest."""
        parts = [_parts(self._sources[r.pack], r, DEMAND_PART_BYTES) for r in refs]
        futures = iter(self._demand.submit_many([p for ps in parts for p in ps],
                                                priority=Priority.DEMAND))
        return {r.digest: [next(futures) for _ in ps] for r, ps in zip(refs, parts, strict=True)}

    def _slice(self, ref: ChunkRef, lo: int, hi: int) -> bytes:
        i = self._slot[ref.digest]
        futs = getattr(self._asked, "futures", {}).pop(ref.digest, None)
        if self._have[i]:
            return os.pread(self._rfd, hi - lo, self.layout.offsets[i] + lo)
        with self._lock:
            self._demanding += 1
        try:
            data = self._demanded(i, ref, futs)
        finally:
            with self._lock:
                self._demanding -= 1
                self._calm.notify_all()
        return data[lo:hi]

    def _demanded(self, i: int, ref: ChunkRef, futs: list[Future] | None) -> bytes:
        """Slot ``i``'s verified bytes, fetched once however many kernel reads (the pieces
        of one read of a chunk come in parallel) want them at once. The figures count the
        chunk and its wait once, not once per piece waiting with it."""
        t0 = time.monotonic()
        with self._lock:
            shared = self._decoding.get(i)
            mine = shared is None
            if shared is None:
                shared = self._decoding[i] = Future()
        if not mine:
            return shared.result()
        try:
            if futs is None:
                futs = self._submit([ref])[ref.digest]
            raw = b"".join(f.result() for f in futs)
            data = self.reader.decode(raw, ref)   # DigestMismatch: never served
            self._put(i, data)
            shared.set_result(data)
            self.stats["demand_chunks"] += 1
            self.stats["demand_s"] += time.monotonic() - t0
            return data
        except BaseException as e:
            shared.set_exception(e)
            raise
        finally:
            with self._lock:
                self._decoding.pop(i, None)

    def _put(self, i: int, data: bytes) -> None:
        """Write slot ``i``'s verified bytes once; the last one completes the blob."""
        with self._lock:
            if self._have[i] or self._part is None:
                return
            off, view = self.layout.offsets[i], memoryview(data)
            while view:
                n = os.pwrite(self._part.fd, view, off)
                view, off = view[n:], off + n
            self._have[i] = 1
            self._left -= 1
            last = self._left == 0
        if last:   # never in a demand read's thread: it waits for the record
            threading.Thread(target=self._complete, name="bootseer-fill-done").start()

    def _complete(self) -> None:
        """Every slot written, each verified as it was: the blob goes into place, stamped
        verified, and the node records it (the next restore mounts it locally)."""
        part = self._part
        assert part is not None
        part.commit(mode=0o444)   # the read descriptor stays valid across the rename
        blobs.mark_verified(self.fill.blob)
        partfile.sweep_dead(os.path.dirname(self.fill.blob))   # a writer not yet gone at start
        record = _wait_for(self.fill.record)
        if record is not None:   # else the next restore verifies the blob and records it
            blobs.remember(self.config, self.fill.key, {**record, "blob": self.fill.blob,
                                                        "layout": self.fill.layout})
        self.stats["complete"] = True
        self.done.set()
        log.info("the environment's blob %s is complete and verified (%d chunks on demand)",
                 self.fill.blob, self.stats["demand_chunks"])

    # -- the fill -----------------------------------------------------------------------------
    def order(self) -> list[int]:
        """Slots in fill order: the profile's first, as recorded, then the rest."""
        first = [self._slot[d] for d in dict.fromkeys(self.fill.hot) if d in self._slot]
        seen = set(first)
        return first + [i for i in range(len(self.layout.refs)) if i not in seen]

    def _run_fill(self) -> None:
        t0 = time.monotonic()
        try:
            if not self.layout.refs:
                self._complete()
            self._fill(self.order())
            self.done.wait(RECORD_WAIT_S)   # the figures say whether it completed
        except Exception as e:  # noqa: BLE001 - demand reads still serve; no blob is made
            self.stats["errors"] += 1
            log.error("the environment's blob fill stopped, it is not kept: %s", e)
        self.stats["seconds"] = round(time.monotonic() - t0, 3)
        self.stats["demand_s"] = round(self.stats["demand_s"], 3)
        log.info("fill ended: %s", self.stats)
        try:   # the start's figures, beside the record (``deps umount`` removes both)
            partfile.write_atomic(os.path.join(os.path.dirname(self.fill.record), FIGURES),
                                  json.dumps(self.stats).encode())
        except OSError as e:
            log.warning("cannot write the fill's figures: %s", e)

    def _fill(self, order: list[int]) -> None:
        reader = TreeReader(self.reader.store, self.fill.tree, self._fill_lane, self.reader.cache)
        refs, hot = self.layout.refs, len(set(self.fill.hot) & set(self._slot))
        pending: deque = deque()
        pos = queued = 0
        while (pos < len(order) or pending) and not self._stop.is_set():
            with self._lock:   # a demand read waits: submit nothing new meanwhile
                self._calm.wait_for(lambda: self._demanding == 0, timeout=0.2)
            batch: list[tuple[int, Priority]] = []
            while pos < len(order) and (not pending and not batch
                                        or queued < FILL_WINDOW_BYTES):
                i, prio, pos = order[pos], PREFETCH if pos < hot else BACKGROUND, pos + 1
                if not self._have[i]:
                    batch.append((i, prio))
                    queued += refs[i].end - refs[i].offset
            batch.sort(key=lambda b: (refs[b[0]].pack, refs[b[0]].offset))   # coalesced
            for i, prio in batch:
                pending.append((i, self._fill_lane.submit_many(
                    _parts(self._fill_sources[refs[i].pack], refs[i], FILL_REQUEST_BYTES),
                    priority=prio)))
            if pending:
                i, futs = pending.popleft()
                raw = b"".join(f.result() for f in futs)
                queued -= refs[i].end - refs[i].offset
                if not self._have[i]:
                    self._put(i, reader.decode(raw, refs[i]))
                    self.stats["filled_chunks"] += 1

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """The server is going: an incomplete part is removed (never a blob that looks
        whole)."""
        self._stop.set()
        with self._lock:
            part, self._part = self._part, None
        if part is not None and not self.done.is_set():
            part.close()
        os.close(self._rfd)


def _parts(source: BlobSource, ref: ChunkRef, size: int) -> list[tuple[BlobSource, int, int]]:
    """``ref``'s stored bytes as ranges of at most ``size``."""
    return ([(source, s, min(s + size, ref.end)) for s in range(ref.offset, ref.end, size)]
            or [(source, ref.offset, ref.end)])


def _wait_for(path: str, timeout_s: float = RECORD_WAIT_S) -> dict | None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                return None
        time.sleep(0.05)


def filling_view(config: BootseerConfig, fill: Fill) -> FillingBlob:
    """Runs in the blob's FUSE server process."""
    return FillingBlob(config, fill)


def blob_file(blobfs: str) -> str:
    return os.path.join(blobfs, BLOB_NAME)


