"""The striped read engine.

A file is read as aligned stripes (``stripe_bytes``, default 8 MiB) fetched in parallel by
the shared :class:`~bootseer.store.fetch.Fetcher` (per-node and per-host caps, retries).
Every stripe held in memory is charged to one :class:`MemoryBudget` shared by all open files
of the process: a demand read waits for budget (back-pressure), read-ahead only takes
budget that is free, so memory never exceeds the budget whatever the number of files.

Each file tracks several cursors (mmap page faults, shared descriptors, DCP readers):
a read that continues a cursor is sequential and doubles that cursor's read-ahead window up
to ``readahead_max_bytes``; a read that continues no cursor is random and is fetched as the
exact range asked for (no stripe, no read-ahead).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from bootseer.config import CkptConfig, FetchConfig
from bootseer.errors import ConfigError, StoreError
from bootseer.store.fetch import Fetcher, Priority

MAX_CURSORS = 32


class BudgetError(ConfigError):
    pass


class MemoryBudget:
    """Bytes of stripe data in memory, shared by every open file (never a window per file)."""

    def __init__(self, total: int, stripe_bytes: int):
        if total < stripe_bytes:
            raise BudgetError("ckpt.memory_budget_bytes",
                              f"{total} bytes is smaller than one stripe ({stripe_bytes} bytes);"
                              " raise the budget or lower ckpt.stripe_bytes")
        self.total, self.used, self.peak = total, 0, 0
        self._cond = threading.Condition()
        self.waits = 0

    def try_acquire(self, n: int) -> bool:
        with self._cond:
            if self.used + n > self.total:
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def acquire(self, n: int, shed=None) -> None:
        """Block until ``n`` bytes are free; ``shed()`` may drop read-ahead to make room."""
        n = min(n, self.total)
        with self._cond:
            while self.used + n > self.total:
                self.waits += 1
                if shed is not None:
                    self._cond.release()
                    try:
                        shed()
                    finally:
                        self._cond.acquire()
                    if self.used + n <= self.total:
                        break
                self._cond.wait(0.05)
            self.used += n
            self.peak = max(self.peak, self.used)

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


class Engine:
    """One per process: the fetcher, the memory budget, the open readers (for shedding)."""

    def __init__(self, config: CkptConfig | None = None, fetch: FetchConfig | None = None):
        import dataclasses
        self.config = config or CkptConfig()
        base = fetch or FetchConfig()
        self.fetcher = Fetcher(dataclasses.replace(
            base, max_inflight=self.config.max_stripes_in_flight,
            connections_per_host=self.config.per_host,
            part_bytes=self.config.stripe_bytes,
            max_coalesced_bytes=self.config.stripe_bytes))
        self.budget = MemoryBudget(self.config.memory_budget_bytes, self.config.stripe_bytes)
        self._readers: set = set()
        self._lock = threading.Lock()

    def reader(self, source, mode: str = "striped"):
        r = (StripedReader if mode == "striped" else SequentialReader)(self, source)
        with self._lock:
            self._readers.add(r)
        return r

    def forget(self, reader) -> None:
        with self._lock:
            self._readers.discard(reader)

    def shed(self) -> None:
        with self._lock:
            readers = list(self._readers)
        # plan-hinted stripes go last: they are about to be read; but they must go when
        # nothing else can, or a demand read could wait on them forever
        if sum(r.shed() for r in readers) == 0:
            for r in readers:
                r.shed(hinted=True)

    def stats(self) -> dict:
        return {**self.fetcher.counters(), "budget_peak": self.budget.peak,
                "budget_waits": self.budget.waits}

    def close(self) -> None:
        self.fetcher.close()


class _Stripe:
    __slots__ = ("future", "nbytes", "demanded")

    def __init__(self, future: Future, nbytes: int, demanded: bool):
        self.future, self.nbytes, self.demanded = future, nbytes, demanded


class _Cursor:
    __slots__ = ("pos", "window", "used")

    def __init__(self, pos: int):
        self.pos, self.window, self.used = pos, 0, time.monotonic()


class StripedReader:
    """Reads of one remote file. Thread-safe; several cursors; stats for the load report."""

    def __init__(self, engine: Engine, source):
        self.engine, self.source = engine, source
        self.size = source.size
        self.S = engine.config.stripe_bytes
        self._stripes: dict[int, _Stripe] = {}
        self._cursors: list[_Cursor] = []
        self._hinted: set[int] = set()
        self._lock = threading.Lock()
        self.consumed = 0
        self.first_byte_s: float | None = None
        self.opened = time.monotonic()
        self._closed = False

    # -- stripes ------------------------------------------------------------------------------
    def _span(self, idx: int) -> tuple[int, int]:
        return idx * self.S, min(self.size, (idx + 1) * self.S)

    def _ensure(self, idx: int, demand: bool) -> _Stripe | None:
        """Caller holds no lock. Submit stripe ``idx`` if it is not held."""
        with self._lock:
            s = self._stripes.get(idx)
            if s is not None:
                if demand and not s.demanded:
                    s.demanded = True
                    if s.future.done():
                        return s
                    start, end = self._span(idx)  # promote a queued read-ahead
                    self.engine.fetcher.submit(self.source, start, end, priority=Priority.DEMAND)
                return s
        start, end = self._span(idx)
        n = end - start
        budget = self.engine.budget
        if demand:
            budget.acquire(n, shed=self.engine.shed)
        elif not budget.try_acquire(n):
            return None
        with self._lock:
            s = self._stripes.get(idx)
            if s is not None:  # another thread got there first
                budget.release(n)
                return s
            fut = self.engine.fetcher.submit(
                self.source, start, end, priority=Priority.DEMAND if demand else Priority.PREFETCH)
            s = self._stripes[idx] = _Stripe(fut, n, demand)
            return s

    def _drop(self, idx: int) -> None:
        """Caller holds the lock. Budget comes back once the stripe's bytes are gone."""
        s = self._stripes.pop(idx, None)
        if s is not None:
            budget = self.engine.budget
            s.future.add_done_callback(lambda _f, n=s.nbytes: budget.release(n))

    def _trim(self) -> None:
        """Caller holds the lock: drop stripes behind every cursor. Stripes ahead of some
        cursor stay (another cursor's read-ahead, a forgotten cursor's) until memory
        pressure sheds them: they are paid for already."""
        low = min((c.pos // self.S for c in self._cursors), default=None)
        for idx in [i for i in self._stripes if (low is None or i < low)
                    and i not in self._hinted]:
            self._drop(idx)

    def _active(self) -> set[int]:
        """Caller holds the lock: stripes inside some cursor's current read-ahead window."""
        keep = set()
        for c in self._cursors:
            first = c.pos // self.S
            last = (min(self.size, c.pos + max(c.window, 1)) - 1) // self.S
            keep.update(range(first, last + 1))
        return keep

    def shed(self, hinted: bool = False) -> int:
        """Give back read-ahead no cursor is about to use (called under memory pressure);
        plan-hinted stripes only when ``hinted``. Returns the number of stripes dropped."""
        n = 0
        with self._lock:
            active = self._active()
            for idx, s in sorted(self._stripes.items(), reverse=True):
                if not s.future.done() or (idx in self._hinted) != hinted or idx in active:
                    continue
                self._hinted.discard(idx)
                self._drop(idx)
                n += 1
                if hinted:
                    break  # one at a time: the hint is still worth the rest
        return n

    # -- reads --------------------------------------------------------------------------------
    def _cursor_for(self, offset: int) -> tuple[_Cursor, bool]:
        with self._lock:
            for c in self._cursors:
                if c.pos - self.S <= offset <= c.pos + self.S:
                    return c, True
            c = _Cursor(offset)
            self._cursors.append(c)
            if len(self._cursors) > MAX_CURSORS:
                self._cursors.remove(min(self._cursors, key=lambda x: x.used))
            return c, False

    def read(self, offset: int, size: int) -> bytes:
        if self._closed:
            raise ValueError("read of a closed checkpoint file")
        end = min(self.size, offset + size)
        if offset >= end:
            return b""
        cursor, sequential = self._cursor_for(offset)
        if not sequential:
            with self._lock:
                held = all(i in self._stripes for i in range(offset // self.S,
                                                             (end - 1) // self.S + 1))
            if not held:  # random access: exactly the bytes asked for, nothing more
                data = self.engine.fetcher.read(self.source, offset, end)
                self._advance(cursor, end, grow=False, n=len(data))
                return data
        parts = []
        first, last = offset // self.S, (end - 1) // self.S
        # a large read puts all its stripes in flight at once, as far as the budget allows
        # (the first one waits for budget: back-pressure); the rest are claimed in order
        ahead = {}
        for idx in range(first + 1, last + 1):
            got = self._ensure(idx, demand=False)
            if got is None:
                break
            ahead[idx] = got
        for idx in range(first, last + 1):
            s = self._ensure(idx, demand=True)
            if idx == first:
                self._readahead(cursor, end)
            data = s.future.result()
            lo, hi = self._span(idx)
            parts.append(memoryview(data)[max(offset, lo) - lo:min(end, hi) - lo])
        out = b"".join(parts)
        self._advance(cursor, end, grow=True, n=len(out))
        return out

    def hint(self, start: int, end: int) -> int:
        """A plan says ``[start, end)`` will be read: put its stripes in flight now, as far
        as free budget allows (never waits). Returns the number of stripes issued."""
        n = 0
        for idx in range(start // self.S, (min(end, self.size) - 1) // self.S + 1):
            if self._ensure(idx, demand=False) is None:
                break
            with self._lock:
                self._hinted.add(idx)
            n += 1
        return n

    def _readahead(self, cursor: _Cursor, end: int) -> None:
        if cursor.window <= 0:
            return
        stop = min(self.size, end + cursor.window)
        for idx in range(end // self.S, (stop - 1) // self.S + 1):
            if self._ensure(idx, demand=False) is None:
                break  # budget full: back-pressure, try again on the next read

    def _advance(self, cursor: _Cursor, end: int, *, grow: bool, n: int) -> None:
        with self._lock:
            if self.first_byte_s is None:
                self.first_byte_s = time.monotonic() - self.opened
            self.consumed += n
            cursor.pos, cursor.used = end, time.monotonic()
            if self._hinted:  # a hinted stripe is done with once a read has passed its end
                self._hinted -= {i for i in self._hinted if (i + 1) * self.S <= end}
            if grow:
                # doubles per sequential read, and at least matches the read just served
                # (one 64 MiB read of a DCP tensor should prefetch the next tensor)
                cursor.window = min(self.engine.config.readahead_max_bytes,
                                    max(2 * cursor.window, 2 * self.S, n))
            self._trim()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._cursors.clear()
            for idx in list(self._stripes):
                self._drop(idx)
        self.engine.forget(self)


class SequentialReader:
    """The fuse-dfs baseline: one buffer, one request in flight, no read-ahead."""

    def __init__(self, engine: Engine, source):
        self.engine, self.source, self.size = engine, source, source.size
        self.buf_bytes = engine.config.stripe_bytes
        self._buf, self._buf_off = b"", -1
        self._lock = threading.Lock()
        self.consumed = 0
        self.first_byte_s = None
        self.opened = time.monotonic()

    def read(self, offset: int, size: int) -> bytes:
        end = min(self.size, offset + size)
        if offset >= end:
            return b""
        out = []
        with self._lock:  # one request in flight per file
            pos = offset
            while pos < end:
                if not (self._buf_off <= pos < self._buf_off + len(self._buf)):
                    stop = min(self.size, pos + self.buf_bytes)
                    self._buf = self._fetch(pos, stop)
                    self._buf_off = pos
                    if self.first_byte_s is None:
                        self.first_byte_s = time.monotonic() - self.opened
                lo = pos - self._buf_off
                chunk = self._buf[lo:lo + end - pos]
                out.append(chunk)
                pos += len(chunk)
            self.consumed += end - offset
        return b"".join(out)

    def _fetch(self, start: int, end: int) -> bytes:
        # straight to the source, with the fetcher's retry policy but one request at a time
        return self.engine.fetcher.submit(self.source, start, end).result()

    def shed(self, hinted: bool = False) -> int:
        return 0

    def close(self) -> None:
        self._buf = b""
        self.engine.forget(self)


__all__ = ["Engine", "MemoryBudget", "StripedReader", "SequentialReader", "BudgetError",
           "StoreError"]
