"""Replicas of a checkpoint file (mirrors) and hedged reads across them.

A checkpoint may be served by several servers (``--mirror URL``: the same relative path
under each mirror is the same file, checked by size and mtime, which nginx's ETag is made
of). Each stripe goes to the replicas in turn (round robin spreads the load). A stripe
still in flight after ``ckpt.hedge_multiple`` times the median of recent stripes (and at
least ``ckpt.hedge_min_s``) is issued again to the next replica: the first answer wins and
the losers hang up at their next piece of body (their connections are dropped, not
drained), so the tail of a slow server no longer gates the load and no longer uses the
link (as in "The Tail at Scale"). A replica that fails (refused, reset, 5xx) hands the
stripe to the next one at once (failover); only when every replica failed does the
fetcher's retry see the error. A file that changed on a replica is never papered over: FileChanged is raised.
"""

from __future__ import annotations

import collections
import itertools
import logging
import statistics
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from bootseer import redact
from bootseer.errors import FetchError, StoreError

log = logging.getLogger(__name__)

RECENT_STRIPES = 64   # the median follows the link as it changes, over about one read-ahead
MIN_SAMPLES = 3       # below this the median says nothing: no hedging yet
POLL_S = 0.02         # how often an in-flight stripe's age is checked against the threshold


class ReplicaMismatch(StoreError):
    """A mirror's file is not the same file as the primary's."""


def check_same(primary_url: str, size: int, mtime: float | None, mirror_url: str,
               mirror_size: int, mirror_mtime: float | None) -> None:
    """Raises ReplicaMismatch unless the mirror's file has the primary's size and mtime."""
    if mirror_size != size:
        raise ReplicaMismatch(
            f"mirror {mirror_url} is {mirror_size} bytes but {primary_url} is {size}: "
            "refusing the mirror (a mirror must be an exact copy of the checkpoint)",
            url=mirror_url)
    if mtime and mirror_mtime and abs(mirror_mtime - mtime) >= 1:
        raise ReplicaMismatch(
            f"mirror {mirror_url} was modified at {mirror_mtime:.0f}, {primary_url} at "
            f"{mtime:.0f}: refusing the mirror (copy it with its times, e.g. rsync -a)",
            url=mirror_url)


class Replicas:
    """One file's replicas (the primary first). Identity is the primary's: the staging
    copy and the cache key do not depend on which replica served a stripe."""

    def __init__(self, sources: list, hedger: "Hedger | None" = None):
        primary = sources[0]
        self.sources, self.hedger = sources, hedger
        self.url, self.size, self.key, self.host = (primary.url, primary.size, primary.key,
                                                    primary.host)
        self.credentialed = any(getattr(s, "credentialed", False) for s in sources)
        self._turn = itertools.count()

    def bind(self, hedger: "Hedger") -> "Replicas":
        """The same replicas, read through ``hedger`` (an engine's)."""
        return Replicas(self.sources, hedger)

    def read_range(self, start: int, end: int) -> bytes:
        k = next(self._turn) % len(self.sources)
        order = self.sources[k:] + self.sources[:k]
        if self.hedger is None:
            return Hedger.failover(order, start, end)
        return self.hedger.read(order, start, end)

    def __repr__(self) -> str:
        return f"Replicas({', '.join(redact.url(s.url) for s in self.sources)})"


class Hedger:
    """The engine's hedging state: recent stripe durations, a thread pool for the
    concurrent attempts, and the counters of the load report."""

    def __init__(self, multiple: float, min_s: float, max_attempts_in_flight: int, counters):
        self.multiple, self.min_s, self.counters = multiple, min_s, counters
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT_STRIPES)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_attempts_in_flight,
                                        thread_name_prefix="bootseer-ckpt-replica")

    def threshold_s(self) -> float | None:
        """Age after which a stripe is hedged (None: too few samples yet)."""
        with self._lock:
            if len(self._recent) < MIN_SAMPLES:
                return None
            return max(self.min_s, self.multiple * statistics.median(self._recent))

    def record(self, seconds: float) -> None:
        with self._lock:
            self._recent.append(seconds)

    def read(self, order: list, start: int, end: int) -> bytes:
        """``[start, end)`` from the first replica of ``order`` that answers."""
        attempts = {}          # future -> start time
        errors: list[BaseException] = []
        cancel = threading.Event()  # set once the read is decided: the losers hang up
        nxt = 0

        def launch() -> None:
            nonlocal nxt
            fut = self._pool.submit(order[nxt].read_range, start, end, cancel)
            attempts[fut] = time.monotonic()
            nxt += 1

        launch()
        try:
            while attempts:
                done, _ = wait(attempts, timeout=POLL_S, return_when=FIRST_COMPLETED)
                for fut in done:
                    began = attempts.pop(fut)
                    error = fut.exception()
                    if error is None:
                        self.record(time.monotonic() - began)
                        return fut.result()  # ``finally`` hangs up the others
                    if isinstance(error, StoreError) and not isinstance(error, FetchError):
                        raise error  # the file changed, is gone, or access is denied
                    errors.append(error)
                    if nxt < len(order):
                        log.info("replica failed, trying the next: %s", error)
                        self.counters.add(failovers=1)
                        launch()
                if attempts and nxt < len(order):
                    limit = self.threshold_s()
                    if limit is not None and time.monotonic() - max(attempts.values()) > limit:
                        self.counters.add(hedged_reads=1)
                        launch()
        finally:
            cancel.set()
        raise FetchError(f"every replica failed for bytes {start}-{end}: "
                         + "; ".join(str(e) for e in errors), url=order[0].url, offset=start)

    @staticmethod
    def failover(order: list, start: int, end: int) -> bytes:
        """Without an engine (no timing): each replica in turn until one answers."""
        errors = []
        for source in order:
            try:
                return source.read_range(start, end)
            except FetchError as e:
                errors.append(e)
        raise FetchError(f"every replica failed for bytes {start}-{end}: "
                         + "; ".join(map(str, errors)), url=order[0].url, offset=start)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
