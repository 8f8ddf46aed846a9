"""The one fetcher of a process: every network read (demand, prefetch, striped reads) goes
through it, so its caps and its ordering hold for the whole process, not per caller.

* priorities: a DEMAND read is served before queued PREFETCH/BACKGROUND work, and a demand
  for a range already queued as prefetch promotes it (never fetched twice);
* a cap on requests in flight and per storage host;
* coalescing: queued ranges of one source that touch (gap <= coalesce_gap_bytes) become
  one request of at most max_coalesced_bytes;
* retries with exponential backoff and jitter on transient errors, a per-read deadline;
* sources with replicas (store/replicas.py) are read as a race: failover, and hedging
  where the policy says so;
* counters for the trace: bytes, requests, retries, errors, coalesced, stall seconds.

Callers read through a :class:`Lane`: a policy (caps, part size, hedging) and counters of
their own over the shared queue and workers. The checkpoint engine's lane has more
connections and larger parts than a tree reader's; closing a lane fails only its queued
reads.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
import logging
import random
import statistics
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeAlias

from bootseer.config import FetchConfig
from bootseer.errors import BlobNotFound, FetchError, RangeError, StoreError
from bootseer.store.backend import Backend
from bootseer.store.digest import verify as check
from bootseer.store.replicas import Race, Replicas
from bootseer.store.source import BlobSource, RangeSource

Source: TypeAlias = RangeSource | Replicas
Range: TypeAlias = tuple[Source, int, int]

log = logging.getLogger(__name__)


class Priority(IntEnum):
    DEMAND = 0
    READAHEAD = 5      # a reader's own read-ahead: before a plan's guesses
    PREFETCH = 10
    BACKGROUND = 20


RECENT_READS = 64    # a hedging lane's median follows the link as it changes
MIN_SAMPLES = 3      # below this the median says nothing: no hedging yet
POLL_S = 0.02        # how often the age of a racing read is checked against its threshold
_COUNTERS = ("bytes", "requests", "retries", "errors", "coalesced", "stall_s", "promoted",
             "deduplicated", "hedged_reads", "failovers")


@dataclass(frozen=True)
class Hedge:
    """Race a replica's read still in flight after ``multiple`` times the median of the
    lane's recent reads (and at least ``min_s`` seconds) against the next replica."""
    multiple: float
    min_s: float


@dataclass(frozen=True)
class Policy:
    """How one lane's reads are made."""
    max_inflight: int
    """Requests of this lane in flight at once."""
    connections_per_host: int
    part_bytes: int
    """A large ``read`` goes out as parts of this size."""
    max_coalesced_bytes: int
    demand_reserve: int = 0
    """Connections per host beyond ``connections_per_host`` that only DEMAND reads may
    use, so a reader waiting is never queued behind a host's worth of read-ahead."""
    hedge: Hedge | None = None
    yields_to_demand: bool = False
    """This lane's queued reads start only while no DEMAND read of their host is in
    flight: a background fill never shares the link with a reader waiting (its reads
    already in flight go on). Meanwhile the host's queue starts nothing past such a read
    at its head (what is queued behind it is no more urgent)."""

    @classmethod
    def of(cls, config: FetchConfig) -> Policy:
        return cls(max_inflight=config.max_inflight,
                   connections_per_host=config.connections_per_host,
                   part_bytes=config.part_bytes, max_coalesced_bytes=config.max_coalesced_bytes)


class _Task:
    __slots__ = ("source", "start", "end", "priority", "order", "future", "seq", "queued",
                 "deadline", "lane", "lanes")

    def __init__(self, lane: Lane, source: Source, start: int, end: int, priority: Priority,
                 seq: int, deadline: float, order: int = 0):
        self.source, self.start, self.end = source, start, end
        self.priority, self.seq, self.deadline = priority, seq, deadline
        self.order = order
        self.future: Future[bytes] = Future()
        self.queued = True
        self.lane = lane                 # whose policy and counters the request uses
        self.lanes = {lane}              # who waits for it (a lane's close drops only its own)

    def __lt__(self, other: _Task) -> bool:
        return ((self.priority, self.order, self.seq)
                < (other.priority, other.order, other.seq))


class Lane:
    """A caller's view of the fetcher: its policy, its counters, its queued reads."""

    def __init__(self, fetcher: Fetcher, policy: Policy):
        self.fetcher, self.policy = fetcher, policy
        self.inflight = 0
        self.closed = False
        self.stats: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
        self.stats["stall_s"] = 0.0
        self.recent: collections.deque[float] = collections.deque(maxlen=RECENT_READS)

    def submit(self, source: Source, start: int, end: int, *,
               priority: Priority = Priority.DEMAND, order: int = 0) -> Future[bytes]:
        """Queue ``[start, end)`` of ``source``; the future resolves to the bytes.
        ``order``: among queued tasks of one priority, lower goes first (then first come,
        first served)."""
        return self.fetcher._submit(self, [(source, start, end)], priority, order)[0]

    def submit_many(self, ranges: Iterable[Range], *, priority: Priority = Priority.DEMAND,
                    order: int = 0) -> list[Future[bytes]]:
        """Queue many ``(source, start, end)`` at once: one lock round and one wake-up
        for the batch (a restore queues many thousand chunks at once)."""
        return self.fetcher._submit(self, ranges, priority, order)

    def read(self, source: Source, start: int, end: int, *,
             priority: Priority = Priority.DEMAND) -> bytes:
        """Blocking read; ranges larger than the policy's part_bytes go out as parallel
        parts. The time spent waiting counts as stall time."""
        t0 = time.monotonic()
        part = self.policy.part_bytes
        try:
            if end <= start:
                return b""
            futures = self.submit_many([(source, s, min(s + part, end))
                                        for s in range(start, end, part)], priority=priority)
            return b"".join(f.result() for f in futures)
        finally:
            self.fetcher._count(self, stall_s=time.monotonic() - t0)

    def counters(self) -> dict[str, float]:
        with self.fetcher._lock:
            return dict(self.stats)

    def hedge_after(self) -> float | None:
        """Under the fetcher's lock: the age after which a racing read is hedged (None:
        no hedging, or too few samples yet)."""
        h = self.policy.hedge
        if h is None or len(self.recent) < MIN_SAMPLES:
            return None
        return max(h.min_s, h.multiple * statistics.median(self.recent))

    def close(self) -> None:
        """Fail this lane's queued reads; reads other lanes also wait for stay queued."""
        self.fetcher._close_lane(self)

    def __enter__(self) -> Lane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Fetcher:
    """The queue and the workers. Its own ``submit``/``read``/``counters`` are those of
    its default lane (the config's policy); :meth:`lane` gives a caller its own."""

    def __init__(self, config: FetchConfig | None = None):
        self.config = config or FetchConfig()
        self._lock = threading.Condition()
        # Queued tasks, two ways: a heap per storage host (the most urgent task of a host
        # with a free connection is found without touching the others' queues), and per
        # source a list sorted by offset (coalescing finds a task's neighbours by bisect).
        # Both are cheap with many thousand queued chunks.
        self._heaps: dict[str, list[_Task]] = {}
        self._by_offset: dict[object, list[tuple[int, int, _Task]]] = {}
        self._by_range: dict[tuple[str, int, int], _Task] = {}
        self._host_busy: dict[str, int] = {}
        self._host_demand: dict[str, int] = {}   # DEMAND requests in flight per host
        self._seq = itertools.count()
        self._closed = False
        self._lanes: list[Lane] = []
        self._races: dict[Race, Lane] = {}
        self._helpers: collections.deque[Race] = collections.deque()
        self._monitor: threading.Thread | None = None
        self._workers: list[threading.Thread] = []
        self.default = self.lane(Policy.of(self.config))

    # -- public -------------------------------------------------------------------------------
    def lane(self, policy: Policy | None = None) -> Lane:
        """A new lane over this fetcher (default: the config's policy). Workers are added
        when the policy allows more requests in flight than there are workers."""
        lane = Lane(self, policy or Policy.of(self.config))
        with self._lock:
            if self._closed:
                raise FetchError("fetcher is closed")
            self._lanes.append(lane)
            while len(self._workers) < max(self.config.max_inflight, lane.policy.max_inflight):
                w = threading.Thread(target=self._work, daemon=True,
                                     name=f"bootseer-fetch-{len(self._workers)}")
                self._workers.append(w)
                w.start()
        return lane

    def submit(self, source: Source, start: int, end: int, *,
               priority: Priority = Priority.DEMAND, order: int = 0) -> Future[bytes]:
        return self.default.submit(source, start, end, priority=priority, order=order)

    def submit_many(self, ranges: Iterable[Range], *, priority: Priority = Priority.DEMAND,
                    order: int = 0) -> list[Future[bytes]]:
        return self.default.submit_many(ranges, priority=priority, order=order)

    def read(self, source: Source, start: int, end: int, *,
             priority: Priority = Priority.DEMAND) -> bytes:
        return self.default.read(source, start, end, priority=priority)

    def counters(self) -> dict[str, float]:
        """The default lane's counters."""
        return self.default.counters()

    def close(self) -> None:
        """Stop the workers; every queued read fails."""
        for lane in list(self._lanes):
            lane.close()
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queueing -----------------------------------------------------------------------------
    def _submit(self, lane: Lane, ranges: Iterable[Range], priority: Priority,
                order: int) -> list[Future[bytes]]:
        futures = []
        with self._lock:
            if self._closed or lane.closed:
                raise FetchError("fetcher is closed")
            promoted = False
            for source, start, end in ranges:
                key = (source.key, start, end)
                existing = self._by_range.get(key)
                if existing is not None:
                    lane.stats["deduplicated"] += 1
                    existing.lanes.add(lane)
                    if existing.queued and priority < existing.priority:
                        existing.priority = priority  # promote: re-heapify its host's queue
                        existing.order = order
                        heapq.heapify(self._heaps[existing.source.host])
                        lane.stats["promoted"] += 1
                        promoted = True
                    futures.append(existing.future)
                    continue
                task = _Task(lane, source, start, end, priority, next(self._seq),
                             time.monotonic() + self.config.deadline_s, order)
                self._by_range[key] = task
                heapq.heappush(self._heaps.setdefault(source.host, []), task)
                bisect.insort(self._by_offset.setdefault(source.key, []),
                              (start, task.seq, task))
                futures.append(task.future)
            if promoted or len(futures) > 1:
                self._lock.notify_all()
            else:
                self._lock.notify()
        return futures

    def _close_lane(self, lane: Lane) -> None:
        with self._lock:
            lane.closed = True
            dropped = []
            for heap in self._heaps.values():
                for t in heap:
                    if t.queued and lane in t.lanes:
                        t.lanes.discard(lane)
                        if not t.lanes:
                            self._dequeue(t)
                            dropped.append(t)
            for t in dropped:
                del self._by_range[(t.source.key, t.start, t.end)]
            if lane in self._lanes:
                self._lanes.remove(lane)
        for t in dropped:
            t.future.set_exception(FetchError("fetcher closed before the read ran"))

    def _count(self, lane: Lane, **deltas: float) -> None:
        with self._lock:
            for name, v in deltas.items():
                lane.stats[name] += v

    def _dequeue(self, task: _Task) -> None:
        """Under the lock: ``task`` is taken (it stays in its host heap, skipped later)."""
        task.queued = False
        lst = self._by_offset.get(task.source.key)
        if lst is not None:
            i = bisect.bisect_left(lst, (task.start, task.seq))
            if i < len(lst) and lst[i][2] is task:
                del lst[i]
            if not lst:
                del self._by_offset[task.source.key]

    def _take(self) -> list[_Task] | Race | None:
        """A race wanting a helper, or the most urgent task whose host and lane have a free
        connection plus queued tasks of the same source that extend it contiguously
        (coalescing)."""
        with self._lock:
            while True:
                if self._closed:
                    return None
                if self._helpers:
                    return self._helpers.popleft()
                task = None
                for host, heap in self._heaps.items():
                    while heap and not heap[0].queued:
                        heapq.heappop(heap)
                    if not heap:
                        continue
                    head = heap[0]
                    p = head.lane.policy
                    limit = p.connections_per_host + (p.demand_reserve
                                                      if head.priority == Priority.DEMAND else 0)
                    if (self._host_busy.get(host, 0) < limit
                            and head.lane.inflight < p.max_inflight
                            and not (p.yields_to_demand and head.priority != Priority.DEMAND
                                     and self._host_demand.get(host, 0))
                            and (task is None or head < task)):
                        task = head
                if task is None:
                    self._lock.wait()
                    continue
                heapq.heappop(self._heaps[task.source.host])
                self._dequeue(task)
                group = [task]
                end = task.end
                # Merge small neighbours only: the parts of one large read stay separate
                # requests (that is the striping).
                gap = self.config.coalesce_gap_bytes
                limit = min(task.lane.policy.max_coalesced_bytes, task.lane.policy.part_bytes)
                while True:  # extend forward with queued neighbours of the same source
                    lst = self._by_offset.get(task.source.key, ())
                    i = bisect.bisect_left(lst, (end,))
                    if i == len(lst) or lst[i][0] - end > gap or lst[i][2].end - task.start > limit:
                        break
                    nxt = lst[i][2]
                    self._dequeue(nxt)
                    group.append(nxt)
                    end = nxt.end
                if len(group) > 1:
                    task.lane.stats["coalesced"] += len(group) - 1
                self._host_busy[task.source.host] = self._host_busy.get(task.source.host, 0) + 1
                if task.priority == Priority.DEMAND:
                    self._host_demand[task.source.host] = (
                        self._host_demand.get(task.source.host, 0) + 1)
                task.lane.inflight += 1
                return group

    # -- workers ------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            group = self._take()
            if group is None:
                return
            if isinstance(group, Race):   # a helper: race the next replica
                source = group.claim()
                if source is not None:
                    group.run(source)
                continue
            head = group[0]
            start, end = head.start, max(t.end for t in group)
            try:
                data = self._fetch(head.lane, head.source, start, end, head.deadline)
            except BaseException as e:  # noqa: BLE001 - delivered to the waiters
                self._finish(group, error=e)
            else:
                self._finish(group, data=data, base=start)
            finally:
                with self._lock:
                    self._host_busy[head.source.host] -= 1
                    if head.priority == Priority.DEMAND:
                        self._host_demand[head.source.host] -= 1
                    head.lane.inflight -= 1
                    self._lock.notify_all()

    def _finish(self, group: list[_Task], *, data: bytes | None = None, base: int = 0,
                error: BaseException | None = None) -> None:
        # Results first, then forget the ranges: a submit of the same range meanwhile gets
        # this (done) future. The other order left a window where the range was neither
        # known nor done, and a caller checking ``future.done()`` then submitting (a
        # read-ahead promoted to demand) fetched it a second time.
        for t in group:
            if data is None:
                t.future.set_exception(error or FetchError("no bytes and no error"))
            else:
                t.future.set_result(data[t.start - base:t.end - base])
        with self._lock:
            for t in group:
                if self._by_range.get((t.source.key, t.start, t.end)) is t:
                    del self._by_range[(t.source.key, t.start, t.end)]

    def _fetch(self, lane: Lane, source: Source, start: int, end: int,
               deadline: float) -> bytes:
        attempt = 0
        while True:
            try:
                self._count(lane, requests=1)
                data = (self._race(lane, source, start, end) if isinstance(source, Replicas)
                        else source.read_range(start, end))
                self._count(lane, bytes=len(data))
                return data
            except (BlobNotFound, RangeError):
                self._count(lane, errors=1)
                raise
            except (FetchError, OSError) as e:
                self._count(lane, errors=1)
                if isinstance(e, StoreError) and not isinstance(e, FetchError):
                    raise
                attempt += 1
                delay = min(self.config.backoff_max_s,
                            self.config.backoff_s * 2 ** (attempt - 1)) * (0.5 + random.random())
                if attempt > self.config.retries or time.monotonic() + delay > deadline:
                    raise FetchError(f"reading {source!r} bytes {start}-{end} failed after "
                                     f"{attempt} attempts: {e}", url=getattr(e, "url", None),
                                     digest=getattr(e, "digest", None), offset=start) from e
                self._count(lane, retries=1)
                log.info("retry %d of %r [%d,%d) in %.2fs: %s", attempt, source, start, end,
                         delay, e)
                time.sleep(delay)

    # -- replicas -----------------------------------------------------------------------------
    def _race(self, lane: Lane, source: Replicas, start: int, end: int) -> bytes:
        """``[start, end)`` from the first replica that answers: this worker tries them in
        turn (failover) while helpers race the next one when the lane hedges."""
        def won(seconds: float) -> None:
            with self._lock:
                lane.recent.append(seconds)

        race = Race(source.rotation(), start, end, on_win=won,
                    on_failover=lambda: self._count(lane, failovers=1))
        with self._lock:
            self._races[race] = lane
            if lane.policy.hedge is not None and self._monitor is None:
                self._monitor = threading.Thread(target=self._watch_races, daemon=True,
                                                 name="bootseer-fetch-hedge")
                self._monitor.start()
            self._lock.notify_all()
        try:
            while (replica := race.claim()) is not None:
                race.run(replica)
            return race.result()
        finally:
            with self._lock:
                del self._races[race]

    def _watch_races(self) -> None:
        """Hand a race to a helper worker once its read is older than its lane's threshold."""
        with self._lock:
            while not self._closed:
                if not self._races:
                    self._lock.wait()
                    continue
                self._lock.wait(POLL_S)
                for race, lane in self._races.items():
                    if race.wants_helper(lane.hedge_after()):
                        lane.stats["hedged_reads"] += 1
                        self._helpers.append(race)
                        self._lock.notify_all()


def fetch_blob(fetcher: Fetcher | Lane, backend: Backend, digest: str, *,
               priority: Priority = Priority.DEMAND,
               size: int | None = None, verify: bool = True) -> bytes:
    """A whole blob through the fetcher (parallel parts), verified against its digest."""
    size = backend.stat(digest) if size is None else size
    data = fetcher.read(BlobSource(backend, digest, size), 0, size, priority=priority)
    if verify:
        check(digest, data, source=backend.url)
    return data
