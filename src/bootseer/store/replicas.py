"""One object served by several sources (mirrors), and the race of one range across them.

A :class:`Replicas` is a range source the fetcher reads as a race: the range goes to the
replicas in turn (round robin spreads the load). When the reading lane's policy hedges
(``fetch.Hedge``), a read still in flight after a multiple of the median of recent reads
is issued again to the next replica by another fetcher worker: the first answer wins and
the losers hang up at their next piece of body (their connections are dropped, not
drained), so the tail of a slow server no longer gates a load and no longer uses the link
("The Tail at Scale"). A replica that fails (refused, reset, 5xx: FetchError) hands the
range to the next one at once (failover); only when every replica failed does the
fetcher's retry see the error. Any other StoreError (the object changed, is gone, access
is denied) ends the race: it is never papered over by another replica.

Each replica's ``read_range(start, end, cancel)`` takes the race's cancel event.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from bootseer import redact
from bootseer.errors import FetchError, StoreError


class Replica(Protocol):
    """One copy: a range source whose read gives up once ``cancel`` is set."""
    url: str
    key: str
    host: str
    size: int

    def read_range(self, start: int, end: int,
                   cancel: threading.Event | None = None) -> bytes: ...


class Replicas:
    """One object's replicas (the primary first). Identity is the primary's: what the
    bytes are keyed by does not depend on which replica served a range."""

    def __init__(self, sources: Sequence[Replica]):
        primary = sources[0]
        self.sources = list(sources)
        self.url, self.size, self.key, self.host = (primary.url, primary.size, primary.key,
                                                    primary.host)
        self.credentialed = any(getattr(s, "credentialed", False) for s in sources)
        self._turn = itertools.count()

    def rotation(self) -> list[Replica]:
        """The replicas in the order the next read tries them."""
        k = next(self._turn) % len(self.sources)
        return self.sources[k:] + self.sources[:k]

    def __repr__(self) -> str:
        return f"Replicas({', '.join(redact.url(s.url) for s in self.sources)})"


class Race:
    """``[start, end)`` from the first of ``order`` that answers. Attempts are run by
    whoever calls :meth:`claim` then :meth:`run` (the fetcher's worker that took the read,
    and helper workers when it hedges); :meth:`result` waits for the decision."""

    def __init__(self, order: list[Replica], start: int, end: int, *,
                 on_failover: Callable[[], None], on_win: Callable[[float], None]):
        self.order, self.start, self.end = order, start, end
        self.on_failover, self.on_win = on_failover, on_win
        self.cancel = threading.Event()   # set once decided: the losers hang up
        self._cond = threading.Condition()
        self._next = 0
        self._running: list[float] = []   # start times of attempts in flight
        self._helper_pending = False
        self._data: bytes | None = None
        self._fatal: BaseException | None = None
        self._errors: list[BaseException] = []

    @property
    def decided(self) -> bool:
        return self.cancel.is_set()

    def claim(self) -> Replica | None:
        """The next untried replica (now running), or None when decided or none is left."""
        with self._cond:
            self._helper_pending = False
            if self.decided or self._next >= len(self.order):
                return None
            source = self.order[self._next]
            self._next += 1
            return source

    def run(self, source: Replica) -> None:
        """One attempt on a claimed replica; its outcome decides the race or is noted."""
        began = time.monotonic()
        with self._cond:
            self._running.append(began)
        failover = False
        try:
            data = source.read_range(self.start, self.end, self.cancel)
        except BaseException as e:  # noqa: BLE001 - the race's outcome, raised by result()
            with self._cond:
                if not self.decided:
                    if isinstance(e, StoreError) and not isinstance(e, FetchError):
                        self._fatal = e
                        self.cancel.set()
                    else:
                        self._errors.append(e)
                        failover = self._next < len(self.order)
        else:
            with self._cond:
                won = not self.decided
                if won:
                    self._data = data
                    self.cancel.set()
            if won:
                self.on_win(time.monotonic() - began)
        finally:
            with self._cond:
                self._running.remove(began)
                self._cond.notify_all()
        if failover:
            self.on_failover()

    def wants_helper(self, after_s: float | None) -> bool:
        """Whether a helper should race another replica now: the newest attempt has been
        in flight longer than ``after_s`` and a replica is left (at most one helper is
        pending at a time)."""
        with self._cond:
            if (after_s is None or self.decided or self._helper_pending or not self._running
                    or self._next >= len(self.order)
                    or time.monotonic() - max(self._running) <= after_s):
                return False
            self._helper_pending = True
            return True

    def result(self) -> bytes:
        """The winner's bytes, once every attempt that could still win has ended."""
        with self._cond:
            while not self.decided and self._running:
                self._cond.wait()
            if self._data is not None:
                return self._data
            if self._fatal is not None:
                raise self._fatal
        raise FetchError(f"every replica failed for bytes {self.start}-{self.end}: "
                         + "; ".join(str(e) for e in self._errors),
                         url=self.order[0].url, offset=self.start)
