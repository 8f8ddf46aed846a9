"""The one fetcher: every network read (demand, prefetch, striped reads) goes through it.

* priorities: a DEMAND read is served before queued PREFETCH/BACKGROUND work, and a demand
  for a range already queued as prefetch promotes it (never fetched twice);
* a cap on requests in flight overall and per storage host;
* coalescing: queued ranges of one source that touch (gap <= coalesce_gap_bytes) become
  one request of at most max_coalesced_bytes;
* retries with exponential backoff and jitter on transient errors, a per-read deadline;
* counters for the trace: bytes, requests, retries, errors, coalesced, stall seconds.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import random
import threading
import time
from concurrent.futures import Future
from enum import IntEnum

from bootseer.config import FetchConfig
from bootseer.errors import BlobNotFound, FetchError, RangeError, StoreError

log = logging.getLogger(__name__)


class Priority(IntEnum):
    DEMAND = 0
    READAHEAD = 5      # a reader's own read-ahead: before a plan's guesses
    PREFETCH = 10
    BACKGROUND = 20


class _Task:
    __slots__ = ("source", "start", "end", "priority", "order", "future", "seq", "queued",
                 "deadline")

    def __init__(self, source, start, end, priority, seq, deadline, order=0):
        self.source, self.start, self.end = source, start, end
        self.priority, self.seq, self.deadline = priority, seq, deadline
        self.order = order
        self.future: Future = Future()
        self.queued = True

    def __lt__(self, other):
        return ((self.priority, self.order, self.seq)
                < (other.priority, other.order, other.seq))


class Fetcher:
    def __init__(self, config: FetchConfig | None = None, *, demand_reserve: int = 0):
        """``demand_reserve``: connections per host beyond ``connections_per_host`` that
        only DEMAND reads may use, so a reader waiting is never queued behind a host's
        worth of read-ahead (the checkpoint engine reserves some; the workers, at most
        ``max_inflight``, still cap the whole)."""
        self.config = config or FetchConfig()
        self.demand_reserve = demand_reserve
        self._lock = threading.Condition()
        # Queued tasks, two ways: a heap per storage host (the most urgent task of a host
        # with a free connection is found without touching the others' queues), and per
        # source a list sorted by offset (coalescing finds a task's neighbours by bisect).
        # Both are cheap with many thousand queued chunks (a restore queues ~10k at once).
        self._heaps: dict[str, list[_Task]] = {}
        self._by_offset: dict[object, list[tuple[int, int, _Task]]] = {}
        self._by_range: dict[tuple, _Task] = {}
        self._host_busy: dict[str, int] = {}
        self._seq = itertools.count()
        self._closed = False
        self._counters = dict(bytes=0, requests=0, retries=0, errors=0, coalesced=0,
                              stall_s=0.0, promoted=0, deduplicated=0)
        self._workers = [threading.Thread(target=self._work, daemon=True,
                                          name=f"bootseer-fetch-{i}")
                         for i in range(self.config.max_inflight)]
        for w in self._workers:
            w.start()

    # -- public -------------------------------------------------------------------------------
    def submit(self, source, start: int, end: int, *, priority: Priority = Priority.DEMAND,
               order: int = 0) -> Future:
        """Queue ``[start, end)`` of ``source``; the future resolves to the bytes.
        ``order``: among queued tasks of one priority, lower goes first (then first come,
        first served)."""
        return self.submit_many([(source, start, end)], priority=priority, order=order)[0]

    def submit_many(self, ranges, *, priority: Priority = Priority.DEMAND,
                    order: int = 0) -> list[Future]:
        """Queue many ``(source, start, end)`` at once: one lock round and one wake-up
        for the batch (a restore queues ~10k chunks; one by one, the submitting thread
        and 64 woken workers fight over the lock for a second)."""
        futures = []
        with self._lock:
            if self._closed:
                raise FetchError("fetcher is closed")
            promoted = False
            for source, start, end in ranges:
                key = (source.key, start, end)
                existing = self._by_range.get(key)
                if existing is not None:
                    self._counters["deduplicated"] += 1
                    if existing.queued and priority < existing.priority:
                        existing.priority = priority  # promote: re-heapify its host's queue
                        existing.order = order
                        heapq.heapify(self._heaps[existing.source.host])
                        self._counters["promoted"] += 1
                        promoted = True
                    futures.append(existing.future)
                    continue
                task = _Task(source, start, end, priority, next(self._seq),
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

    def read(self, source, start: int, end: int, *, priority: Priority = Priority.DEMAND
             ) -> bytes:
        """Blocking read; ranges larger than part_bytes go out as parallel parts.
        The time spent waiting counts as stall time."""
        t0 = time.monotonic()
        part = self.config.part_bytes
        futures = [self.submit(source, s, min(s + part, end), priority=priority)
                   for s in range(start, end, part)] or [None]
        try:
            if futures == [None]:
                return b""
            return b"".join(f.result() for f in futures)
        finally:
            with self._lock:
                self._counters["stall_s"] += time.monotonic() - t0

    def counters(self) -> dict:
        with self._lock:
            return dict(self._counters)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for heap in self._heaps.values():
                for t in heap:
                    if t.queued:
                        t.queued = False
                        t.future.set_exception(FetchError("fetcher closed before the read ran"))
            self._heaps.clear()
            self._by_offset.clear()
            self._lock.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- workers ------------------------------------------------------------------------------
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

    def _take(self) -> list[_Task] | None:
        """Pop the most urgent task whose host has a free connection, plus queued tasks of
        the same source that extend it contiguously (coalescing)."""
        with self._lock:
            while True:
                if self._closed:
                    return None
                cap = self.config.connections_per_host
                task = None
                for host, heap in self._heaps.items():
                    while heap and not heap[0].queued:
                        heapq.heappop(heap)
                    if not heap:
                        continue
                    limit = cap + (self.demand_reserve if heap[0].priority == Priority.DEMAND
                                   else 0)
                    if self._host_busy.get(host, 0) < limit and (task is None or heap[0] < task):
                        task = heap[0]
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
                limit = min(self.config.max_coalesced_bytes, self.config.part_bytes)
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
                    self._counters["coalesced"] += len(group) - 1
                self._host_busy[task.source.host] = self._host_busy.get(task.source.host, 0) + 1
                return group

    def _work(self) -> None:
        while True:
            group = self._take()
            if group is None:
                return
            head = group[0]
            start, end = head.start, max(t.end for t in group)
            try:
                data = self._fetch(head.source, start, end, head.deadline)
            except BaseException as e:  # noqa: BLE001 - delivered to the waiters
                self._finish(group, error=e)
            else:
                self._finish(group, data=data, base=start)
            finally:
                with self._lock:
                    self._host_busy[head.source.host] -= 1
                    self._lock.notify_all()

    def _finish(self, group, *, data=None, base=0, error=None) -> None:
        # Results first, then forget the ranges: a submit of the same range meanwhile gets
        # this (done) future. The other order left a window where the range was neither
        # known nor done, and a caller checking ``future.done()`` then submitting (a
        # read-ahead promoted to demand) fetched it a second time.
        for t in group:
            if error is not None:
                t.future.set_exception(error)
            else:
                t.future.set_result(data[t.start - base:t.end - base])
        with self._lock:
            for t in group:
                if self._by_range.get((t.source.key, t.start, t.end)) is t:
                    del self._by_range[(t.source.key, t.start, t.end)]

    def _fetch(self, source, start: int, end: int, deadline: float) -> bytes:
        attempt = 0
        while True:
            try:
                with self._lock:
                    self._counters["requests"] += 1
                data = source.read_range(start, end)
                with self._lock:
                    self._counters["bytes"] += len(data)
                return data
            except (BlobNotFound, RangeError):
                with self._lock:
                    self._counters["errors"] += 1
                raise
            except (FetchError, OSError) as e:
                with self._lock:
                    self._counters["errors"] += 1
                if isinstance(e, StoreError) and not isinstance(e, FetchError):
                    raise
                attempt += 1
                delay = min(self.config.backoff_max_s,
                            self.config.backoff_s * 2 ** (attempt - 1)) * (0.5 + random.random())
                if attempt > self.config.retries or time.monotonic() + delay > deadline:
                    raise FetchError(f"reading {source!r} bytes {start}-{end} failed after "
                                     f"{attempt} attempts: {e}", url=getattr(e, "url", None),
                                     digest=getattr(e, "digest", None), offset=start) from e
                with self._lock:
                    self._counters["retries"] += 1
                log.info("retry %d of %r [%d,%d) in %.2fs: %s", attempt, source, start, end,
                         delay, e)
                time.sleep(delay)


def fetch_blob(fetcher: Fetcher, backend, digest: str, *, priority: Priority = Priority.DEMAND,
               size: int | None = None, verify: bool = True) -> bytes:
    """A whole blob through the fetcher (parallel parts), verified against its digest."""
    from bootseer.store.digest import verify as check
    from bootseer.store.source import BlobSource
    size = backend.stat(digest) if size is None else size
    data = fetcher.read(BlobSource(backend, digest, size), 0, size, priority=priority)
    if verify:
        check(digest, data, source=backend.url)
    return data
