"""The striped read engine: one per process, behind the FUSE mount, ``bootseer.ckpt.open``,
the DCP reader and plan prefetch.

A file is read as aligned stripes (``ckpt.stripe_bytes``, 8 MiB by default) fetched in
parallel through the engine's lane of the process's fetcher (store/client.py): more
connections per host, stripe-sized parts and hedged reads across mirrors, in the one queue
that caps the process's requests and orders demand before prefetch. A stripe lands in
the node's staging file (ckpt/staging.py), so a second load, or a load after plan
prefetch, reads local disk.
Every stripe in flight is charged to one :class:`MemoryBudget` (ckpt/budget.py): demand
reads wait for room, read-ahead and prefetch take only free room.

Per file, several cursors are tracked (mmap page faults, shared descriptors, DCP's reads
of many tensors): a read that continues a cursor (within one stripe of where it stopped)
is sequential and doubles that cursor's read-ahead up to ``readahead_max_bytes``; a read at
offset 0 starts a sequential cursor (files are read from the start far more often than
not). Any other read is random: unless its stripes are staged or already coming, it is
fetched as the exact range asked for (no stripe, no read-ahead, nothing staged), which
keeps ``torch.load``'s zip directory lookups and mmap faults from pulling whole stripes.

A file a node reads only a few scattered items of (ckpt/share.py) is *held* instead: those
exact ranges are fetched at once and kept in memory, reads inside them are served from
there without a cursor or read-ahead, and the first read elsewhere tells the planner that
this node reads the file after all.

``mode="single"`` is the baseline to beat, Hadoop fuse-dfs: one buffer per open file, one
request in flight, no read-ahead, no staging.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import threading
import time
from concurrent.futures import Future

from bootseer.ckpt.budget import BudgetError, MemoryBudget
from bootseer.ckpt.profile import AccessRecorder
from bootseer.ckpt.staging import StagedFile, StagingArea
from bootseer.ckpt.stats import LoadCounters, LoadStats
from bootseer.config import CkptConfig, FetchConfig
from bootseer.store.client import process_fetcher
from bootseer.store.fetch import Hedge, Policy, Priority
from bootseer.store.replicas import Replicas

MAX_CURSORS = 32  # per file; DCP reads one cursor per tensor it slices, mmap a few
HOLD_MAX_BYTES = 256 << 20   # per engine: held ranges live in memory until their file is staged
MODES = ("striped", "single")
DEMAND_PARTS = 8                  # a demanded stripe nobody asked for yet goes out in parts
DEMAND_PART_MIN_BYTES = 256 << 10


def demand_part_bytes(stripe_bytes: int) -> int:
    """Size of the parts a demanded stripe is fetched in, in parallel, on the connections
    only demand may use: with read-ahead on every connection, a whole stripe on one more
    connection would get a small share of the link and keep the reader waiting for it
    (seen: half a second per DCP tensor taken out of file order)."""
    return max(DEMAND_PART_MIN_BYTES, -(-stripe_bytes // DEMAND_PARTS))


def _joined(parts: list[Future]) -> Future:
    """One future for the bytes of consecutive ``parts`` (the first error, if any)."""
    whole: Future = Future()
    left = [len(parts)]
    lock = threading.Lock()

    def done(_):
        with lock:
            left[0] -= 1
            if left[0]:
                return
        error = next((f.exception() for f in parts if f.exception() is not None), None)
        if error is not None:
            whole.set_exception(error)
        else:
            whole.set_result(b"".join(f.result() for f in parts))
    for f in parts:
        f.add_done_callback(done)
    return whole


def lane_policy(config: CkptConfig) -> Policy:
    """How the engine's stripes are fetched: its own caps on stripes in flight and
    connections per host, some connections only demand may use (a reader waiting is never
    queued behind a host's worth of read-ahead), and hedging across mirrors."""
    return Policy(max_inflight=config.max_stripes_in_flight,
                  connections_per_host=config.per_host, part_bytes=config.stripe_bytes,
                  max_coalesced_bytes=demand_part_bytes(config.stripe_bytes),
                  demand_reserve=max(1, config.per_host // 2),
                  hedge=Hedge(config.hedge_multiple, config.hedge_min_s))


class Engine:
    """The fetcher's lane, the memory budget, the staging area, and one StripedFile per
    remote file version (all cursors of all opens of that file share it)."""

    def __init__(self, config: CkptConfig | None = None, fetch: FetchConfig | None = None, *,
                 staging: str | None = None, store_url: str | None = None):
        self.config = config or CkptConfig()
        self.store_url = store_url   # where access profiles are shared across nodes
        self.fetcher = process_fetcher(fetch).lane(lane_policy(self.config))
        try:
            self.budget = MemoryBudget(self.config.memory_budget_bytes, self.config.stripe_bytes)
        except BudgetError:
            self.fetcher.close()
            raise
        mode = self.config.staging_mode
        self.staging = (StagingArea(staging, mode=mode) if staging
                        else StagingArea.temporary(mode=mode))
        self.staging.register()   # `ckpt gc` spares what this engine takes up
        self.counters = LoadCounters()
        self.recorder = AccessRecorder()
        self._internal = threading.local()   # this thread reads for bootseer, not a reader
        self.births = itertools.count(1)     # cursors, in the order they appear
        self._files: dict[str, StripedFile] = {}
        self._lock = threading.Lock()
        self.held_bytes = 0
        self.closed = False

    def take_hold(self, nbytes: int) -> bool:
        """Room for ``nbytes`` more of held ranges (never more than HOLD_MAX_BYTES)."""
        with self._lock:
            if self.held_bytes + nbytes > HOLD_MAX_BYTES:
                return False
            self.held_bytes += nbytes
            return True

    def give_hold(self, nbytes: int) -> None:
        with self._lock:
            self.held_bytes -= nbytes

    def file(self, source) -> StripedFile:
        """The striped reader of ``source`` (one per file version, shared)."""
        with self._lock:
            f = self._files.get(source.key)
            if f is None:
                f = self._files[source.key] = StripedFile(self, source)
            return f

    def reader(self, source, mode: str = "striped"):
        """A reader of ``source``: the shared striped one, or a new single-stream one."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        if isinstance(source, Replicas) and mode == "single":
            source = source.sources[0]  # the baseline reads one server
        return self.file(source) if mode == "striped" else SingleStreamReader(self, source)

    @contextlib.contextmanager
    def internal_reads(self):
        """Reads of this thread inside the block (the planner's metadata reads) are not a
        reader's: they count in neither the load report nor the access profile."""
        self._internal.on = True
        try:
            yield
        finally:
            self._internal.on = False

    def consumed(self, source, start: int, end: int) -> None:
        """``[start, end)`` of ``source`` was handed to a reader: report and profile."""
        if getattr(self._internal, "on", False):
            return
        self.counters.consumed(source, start, end)
        self.recorder.add(source.url, source.key, start, end)

    def statistics(self) -> LoadStats:
        return self.counters.snapshot(self.fetcher.counters(), self.budget)

    def close(self) -> None:
        self.closed = True
        self.fetcher.close()
        self.staging.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Cursor:
    __slots__ = ("pos", "window", "used", "born")

    def __init__(self, pos: int, born: int):
        self.pos, self.window, self.used = pos, 0, time.monotonic()
        self.born = born   # engine-wide: the newest cursor's read-ahead goes out first


class _InFlight:
    """A stripe requested and not yet staged; ``landed`` is set once it is (or failed)."""
    __slots__ = ("future", "landed", "demanded")

    def __init__(self, future: Future, demanded: bool):
        self.future, self.landed, self.demanded = future, threading.Event(), demanded


class _Held:
    """An exact range fetched ahead of the reads that want it (not staged)."""
    __slots__ = ("start", "end", "future")

    def __init__(self, start: int, end: int, future: Future):
        self.start, self.end, self.future = start, end, future


class StripedFile:
    """Reads of one remote file version. Thread-safe."""

    def __init__(self, engine: Engine, source):
        self.engine, self.source, self.size = engine, source, source.size
        self.S = engine.config.stripe_bytes
        self.staged: StagedFile = engine.staging.file(
            source.key, source.size, self.S, private=getattr(source, "credentialed", False))
        self._inflight: dict[int, _InFlight] = {}
        self._failed: dict[int, BaseException] = {}
        self._cursors: list[_Cursor] = []
        self._lock = threading.Lock()
        self._holds: list[_Held] = []
        self._on_other_read = None

    # -- held ranges ----------------------------------------------------------------------------
    def hold(self, ranges: list[tuple[int, int]], on_other_read) -> bool:
        """Fetch ``ranges`` (sorted, disjoint) as they are and serve reads inside them from
        memory; ``on_other_read()`` runs once, at the first read that starts outside them.
        False (nothing held) when the file is staged already (its reads are local) or the
        engine's room for held ranges is used up."""
        if not ranges or self.staged.complete or \
                not self.engine.take_hold(sum(b - a for a, b in ranges)):
            return False
        futures = self.engine.fetcher.submit_many([(self.source, a, b) for a, b in ranges],
                                                  priority=Priority.DEMAND)
        with self._lock:
            self._holds = [_Held(a, b, f) for (a, b), f in zip(ranges, futures, strict=True)]
            self._on_other_read = on_other_read
        return True

    def _held_read(self, offset: int, end: int) -> bytes | None:
        """``[offset, end)`` from the held ranges; None: read it as any other read."""
        if not self._holds:
            return None
        if self.staged.complete:   # streamed whole since: reads are local, holds not needed
            self._drop(self._holds)
            return None
        with self._lock:
            # sorted and disjoint: only the last one starting at or before ``offset`` can
            # hold it (a bisection: every read of the file asks, its own part's too)
            holds = self._holds
            i = bisect.bisect_right(holds, offset, key=lambda h: h.start) - 1
            inside = holds[i] if i >= 0 and offset < holds[i].end else None
            hook = None
            if inside is None:
                hook, self._on_other_read = self._on_other_read, None
        if hook is not None:
            hook()
        if inside is None:
            return None
        if inside.future.exception() is not None:   # a reader's own read gets its own error
            self._drop([inside])
            return None
        data = inside.future.result()[offset - inside.start:end - inside.start]
        if end > inside.end:   # the kernel's read-ahead past it: exact, no cursor, no stripes
            data += (self.staged.pread(inside.end, end - inside.end)
                     if self.staged.has_range(inside.end, end)
                     else self.engine.fetcher.read(self.source, inside.end, end))
        self.engine.consumed(self.source, offset, offset + len(data))
        return data

    def _drop(self, holds: list[_Held]) -> None:
        """Forget ``holds``: their memory goes back to the engine's room for held ranges."""
        with self._lock:
            gone = [h for h in self._holds if h in holds]
            self._holds = [h for h in self._holds if h not in holds]
            if not self._holds:
                self._on_other_read = None
        self.engine.give_hold(sum(h.end - h.start for h in gone))

    # -- stripes ------------------------------------------------------------------------------
    def issue(self, idx: int, *, demand: bool, order: int | None = None
              ) -> _InFlight | bool:
        """Request stripe ``idx`` unless it is staged (True) or coming (its _InFlight).
        A demand waits for budget; read-ahead gets False when the budget is full.
        ``order``: a reader's read-ahead (fetched before a plan's stripes, lower first);
        None: a plan's prefetch."""
        with self._lock:
            if self.staged.has(idx):
                return True
            got = self._inflight.get(idx)
            if got is not None:
                if demand and not got.demanded:  # promote a queued read-ahead
                    got.demanded = True
                    if got.future.done():
                        return got
                    self.engine.fetcher.submit(self.source, *self.staged.span(idx),
                                               priority=Priority.DEMAND)
                return got
        start, end = self.staged.span(idx)
        budget = self.engine.budget
        if demand:
            budget.acquire(end - start)
        elif not budget.try_acquire(end - start):
            return False
        with self._lock:
            # another thread got there first: staged it, or has it coming
            if self.staged.has(idx):
                budget.release(end - start)
                return True
            got = self._inflight.get(idx)
            if got is not None:
                budget.release(end - start)
                return got
            part = demand_part_bytes(self.S)
            if demand and end - start > part:
                fut = _joined(self.engine.fetcher.submit_many(
                    [(self.source, a, min(a + part, end)) for a in range(start, end, part)],
                    priority=Priority.DEMAND))
            else:
                priority = (Priority.DEMAND if demand else Priority.PREFETCH if order is None
                            else Priority.READAHEAD)
                fut = self.engine.fetcher.submit(self.source, start, end, priority=priority,
                                                 order=order or 0)
            got = self._inflight[idx] = _InFlight(fut, demand)
        fut.add_done_callback(lambda f: self._land(idx, f, end - start))
        return got

    def _land(self, idx: int, fut: Future, nbytes: int) -> None:
        error = fut.exception()
        try:
            if error is None:
                self.staged.write(idx, fut.result())
                self.engine.counters.add(fetched_stripes=1)
        except BaseException as e:  # noqa: BLE001 - staging disk full: fail the reader, never hang
            error = e
        finally:
            with self._lock:
                got = self._inflight.pop(idx, None)
                # a read-ahead's failure is not a reader's: the reader that needs the
                # stripe asks again (and gets its own error if it fails again)
                if error is not None and got is not None and got.demanded:
                    self._failed[idx] = error
            self.engine.budget.release(nbytes)
            if got is not None:
                got.landed.set()

    def wait_staged(self, idx: int) -> None:
        """Block until stripe ``idx`` is staged; its fetch error is raised here."""
        while True:
            with self._lock:
                if idx in self._failed:
                    raise self._failed.pop(idx)
            got = self.issue(idx, demand=True)
            if got is True:
                return
            assert got is not False, "a demand waits for budget: issue() never refuses it"
            if not got.landed.is_set():
                t0 = time.monotonic()
                got.landed.wait()
                self.engine.counters.add(stall_s=time.monotonic() - t0, stalls=1)

    # -- reads --------------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes:
        """Bytes at ``offset`` (fewer at the end of the file). The FUSE path: one copy,
        from the staged file's page cache into the returned bytes."""
        end = min(self.size, offset + size)
        if offset >= end:
            return b""
        held = self._held_read(offset, end)
        if held is not None:
            return held
        cursor, direct = self._prepare(offset, end)
        if direct is not None:
            return direct
        data = self.staged.pread(offset, end - offset)
        self._advance(cursor, end, n=len(data))
        return data

    def readinto(self, offset: int, buf: memoryview) -> int:
        """Bytes at ``offset`` into ``buf``; returns how many (0 at the end of the file)."""
        end = min(self.size, offset + len(buf))
        if offset >= end:
            return 0
        direct = self._held_read(offset, end)
        if direct is not None:
            buf[:len(direct)] = direct
            return len(direct)
        cursor, direct = self._prepare(offset, end)
        if direct is not None:
            buf[:len(direct)] = direct
            return len(direct)
        n = self.staged.readinto(offset, buf[:end - offset])
        self._advance(cursor, end, n=n)
        return n

    def _prepare(self, offset: int, end: int) -> tuple[_Cursor, bytes | None]:
        """Get ``[offset, end)`` staged (sequential reads: stripes, read-ahead), or return
        it fetched as the exact range (random reads of stripes nobody holds)."""
        cursor, sequential = self._cursor_for(offset)
        first, last = offset // self.S, (end - 1) // self.S
        if not sequential and not self._held(first, last):
            data = self.engine.fetcher.read(self.source, offset, end)
            self._advance(cursor, end, n=len(data))
            return cursor, data
        if sequential:
            # the window grows when a sequential reader asks, not once its bytes are in:
            # the first read of a file then sends read-ahead along with its own stripe
            # instead of leaving the link to that one stripe until it lands
            self._grow(cursor, end - offset)
        for idx in range(first, last + 1):  # all in flight first: a large read is parallel
            self.issue(idx, demand=True)
        self._readahead(cursor, end)
        for idx in range(first, last + 1):
            self.wait_staged(idx)
        return cursor, None

    def _held(self, first: int, last: int) -> bool:
        with self._lock:
            return all(self.staged.has(i) or i in self._inflight for i in range(first, last + 1))

    def _cursor_for(self, offset: int) -> tuple[_Cursor, bool]:
        with self._lock:
            for c in self._cursors:
                if c.pos - self.S <= offset <= c.pos + self.S:
                    return c, True
            c = _Cursor(offset, next(self.engine.births))
            self._cursors.append(c)
            if len(self._cursors) > MAX_CURSORS:
                self._cursors.remove(min(self._cursors, key=lambda x: x.used))
            return c, offset == 0

    def _readahead(self, cursor: _Cursor, end: int) -> None:
        """Keep ``cursor.window`` bytes after ``end`` coming (requested, not yet staged),
        looking at most two windows ahead. Staged stripes do not count: a reader entering
        a region read ahead earlier (DCP loads tensors in key order, not file order) must
        not leave the link idle while it reads what is local, then wait for what follows."""
        if cursor.window <= 0 or end >= self.size:
            return
        coming = 0
        horizon = min(self.size, end + 2 * cursor.window)
        # a reader that moved on (DCP: to the next tensor in key order) has its new
        # stream's stripes go out before what the stream it left still has queued
        newest_first = -cursor.born << 40
        for idx in range(end // self.S, (horizon - 1) // self.S + 1):
            got = self.issue(idx, demand=False, order=newest_first + idx)
            if got is False:
                break  # budget full: back-pressure, try again on the next read
            if got is not True:
                start, stop = self.staged.span(idx)
                coming += stop - max(start, end)
                if coming >= cursor.window:
                    break

    def _grow(self, cursor: _Cursor, n: int) -> None:
        """Double the window per sequential read, and at least match the read (one 64 MiB
        read of a DCP tensor should prefetch the next tensor)."""
        with self._lock:
            cursor.window = min(self.engine.config.readahead_max_bytes,
                                max(2 * cursor.window, 2 * self.S, n))

    def _advance(self, cursor: _Cursor, end: int, *, n: int) -> None:
        with self._lock:
            cursor.pos, cursor.used = end, time.monotonic()
        self.engine.consumed(self.source, end - n, end)

    def close(self) -> None:
        """Readers are shared per file version and outlive an open: nothing to free."""


class SingleStreamReader:
    """The fuse-dfs baseline: one buffer, one request in flight, no read-ahead."""

    def __init__(self, engine: Engine, source):
        self.engine, self.source, self.size = engine, source, source.size
        self.buf_bytes = engine.config.stripe_bytes
        self._buf, self._buf_off = b"", -1
        self._lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        end = min(self.size, offset + size)
        if offset >= end:
            return b""
        out = []
        with self._lock:  # one request in flight per file
            pos = offset
            while pos < end:
                if not self._buf_off <= pos < self._buf_off + len(self._buf):
                    stop = min(self.size, pos + self.buf_bytes)
                    t0 = time.monotonic()
                    self._buf = self.engine.fetcher.submit(self.source, pos, stop).result()
                    self.engine.counters.add(stall_s=time.monotonic() - t0, stalls=1)
                    self._buf_off = pos
                lo = pos - self._buf_off
                chunk = self._buf[lo:lo + end - pos]
                out.append(chunk)
                pos += len(chunk)
        self.engine.consumed(self.source, offset, end)
        return b"".join(out)

    def readinto(self, offset: int, buf: memoryview) -> int:
        data = self.read(offset, len(buf))
        buf[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self._buf = b""
