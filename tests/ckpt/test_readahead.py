"""Read-ahead of the striped engine, seen from the storage side: which ranges it asks for
and when. The remote file is a fake at the source seam (the fetcher's ``read_range``) that
records every request and answers only when the test lets it, so the order is exact."""

from __future__ import annotations

import random
import threading
import time

import pytest

from bootseer.ckpt.engine import Engine
from bootseer.config import CkptConfig, FetchConfig

pytestmark = pytest.mark.timeout(60)
KiB = 1024
S = 64 * KiB   # stripe


class RecordedSource:
    """A remote file: records each range asked for; ``hold()`` keeps answers back until
    ``release()``."""

    def __init__(self, data: bytes):
        self.data, self.size = data, len(data)
        self.url = "http://storage.test/model.bin"
        self.host = "storage.test"
        self.key = f"{self.url}|{self.size}|1"
        self.requests: list[tuple[int, int]] = []
        self._cond = threading.Condition()
        self._held = False

    def hold(self) -> None:
        with self._cond:
            self._held = True

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def starts(self) -> set[int]:
        with self._cond:
            return {a for a, _ in self.requests}

    def wait_requests(self, n: int, timeout_s: float = 5) -> None:
        with self._cond:
            self._cond.wait_for(lambda: len(self.requests) >= n, timeout_s)

    def read_range(self, start: int, end: int) -> bytes:
        with self._cond:
            self.requests.append((start, end))
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._held, 30)
        return self.data[start:end]


def engine(tmp_path, **kw) -> Engine:
    cfg = {"stripe_bytes": S, "memory_budget_bytes": 4096 * KiB, "max_stripes_in_flight": 16,
           "per_host": 16, "readahead_max_bytes": 4 * S}
    cfg.update(kw)
    return Engine(CkptConfig(**cfg), FetchConfig(retries=0, timeout_s=5, deadline_s=20),
                  staging=str(tmp_path / "staging"))


def wait_idle(e: Engine, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while e.budget.used and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def data() -> bytes:
    return random.Random(3).randbytes(32 * S)


def test_first_read_of_a_file_sends_read_ahead_with_its_own_stripe(tmp_path, data):
    """The window grows when a sequential reader asks: while the first stripe of a file is
    still on the network, the next ones are already requested (they were requested only
    once the first had landed, leaving the link to one stripe for a whole round trip)."""
    src = RecordedSource(data)
    e = engine(tmp_path)
    try:
        f = e.file(src)
        src.hold()
        got = {}
        reader = threading.Thread(target=lambda: got.setdefault("head", f.read(0, 4096)))
        reader.start()
        src.wait_requests(3)
        assert {0, S, 2 * S} <= src.starts()   # stripe 0 and its read-ahead, together
        src.release()
        reader.join(10)
        assert got["head"] == data[:4096]
        wait_idle(e)
    finally:
        src.release()
        e.close()


def test_read_ahead_runs_past_stripes_already_staged(tmp_path, data):
    """A reader entering a region staged earlier (DCP reads tensors in key order, not file
    order) keeps the window's worth of what comes after it on the way: the staged stripes
    do not count, so the link does not idle while the reader reads what is local."""
    src = RecordedSource(data)
    e = engine(tmp_path)
    try:
        f = e.file(src)
        for idx in range(1, 7):   # stripes 1-6 staged, as an earlier cursor leaves them
            f.wait_staged(idx)
        wait_idle(e)
        before = len(src.requests)
        assert f.read(0, 4096) == data[:4096]          # a sequential reader at the start
        assert f.read(4096, S) == data[4096:4096 + S]  # ... window now 4 stripes
        wait_idle(e)
        asked = {a // S for a, _ in src.requests[before:]}
        assert asked >= {0, 7, 8, 9}           # past the staged run, at once
        assert not asked & set(range(1, 7))    # nothing staged fetched again
        assert max(asked) <= 9                 # never more than two windows ahead
        out = bytearray()
        pos = 4096 + S
        while pos < len(data):
            chunk = f.read(pos, 100_000)
            out += chunk
            pos += len(chunk)
        assert bytes(out) == data[4096 + S:]
        assert e.statistics().bytes_fetched == len(data)   # every stripe exactly once
    finally:
        src.release()
        e.close()


def test_a_new_stream_s_read_ahead_goes_before_what_an_old_one_left_queued(tmp_path, data):
    """One connection, so the queue's order is the order on the wire. A reader leaves a
    stream (its read-ahead still queued) for another (DCP's next tensor in key order): the
    new stream's read-ahead goes out first; the old one's follows, nothing is dropped."""
    src = RecordedSource(data)
    e = engine(tmp_path, per_host=1, max_stripes_in_flight=4)
    try:
        f = e.file(src)
        for idx in (20, 21):   # where the second stream starts is local already
            f.wait_staged(idx)
        wait_idle(e)
        src.hold()
        before = len(src.requests)
        old = threading.Thread(target=lambda: f.read(0, 4096))   # stripe 0 + read-ahead 1, 2
        old.start()
        src.wait_requests(before + 1)   # stripe 0 on the wire, 1 and 2 queued behind it
        assert f.read(20 * S, 4096) == data[20 * S:20 * S + 4096]   # a new stream ...
        assert f.read(20 * S + 4096, S) == data[20 * S + 4096:21 * S + 4096]   # ... reads on
        src.release()
        old.join(10)
        wait_idle(e)
        order = [a // S for a, _ in src.requests[before:]]
        assert order == [0, 22, 23, 1, 2]
    finally:
        src.release()
        e.close()


def test_a_demanded_stripe_does_not_wait_behind_a_host_full_of_read_ahead(tmp_path):
    """Every connection to the host carries prefetch: a reader's stripe nobody asked for
    yet goes out at once, in parts, on the connections only demand may use (it queued
    behind them, then came at one connection's share of the link)."""
    big = 2048 * KiB
    data = random.Random(4).randbytes(16 * big)
    src = RecordedSource(data)
    e = engine(tmp_path, stripe_bytes=big, memory_budget_bytes=64 * big, per_host=4,
               max_stripes_in_flight=16, readahead_max_bytes=2 * big)
    try:
        from bootseer.ckpt.prefetch import Prefetch, Span
        src.hold()
        plan = Prefetch(e, [Span(src, 8 * big, 12 * big)])   # four stripes: the host is full
        src.wait_requests(4)
        got = {}
        reader = threading.Thread(target=lambda: got.setdefault("head", e.file(src).read(0, 4096)))
        reader.start()
        src.wait_requests(6)
        part = big // 8
        assert {0, part} <= src.starts()   # the demand's first parts, with the host full
        assert all(b - a == part for a, b in src.requests if a < big)
        src.release()
        reader.join(10)
        assert got["head"] == data[:4096]
        assert plan.join(10) and plan.failed == 0
        wait_idle(e)
        f = e.file(src)
        assert f.read(0, 16 * big) == data   # parts joined in order, every stripe right
    finally:
        src.release()
        e.close()
