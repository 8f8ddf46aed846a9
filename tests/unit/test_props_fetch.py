"""Property tests of the fetcher's range coalescing: queued ranges of one blob that touch
(gap at most ``coalesce_gap_bytes``) go out as one request no larger than the limits, every
caller gets exactly its bytes, and no range is fetched twice."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from bootseer.config import FetchConfig
from bootseer.store.fetch import Fetcher, Priority
from bootseer.store.source import BlobSource
from bootseer.testing.fakes import MemoryBackend

SIZE = 4096


class GatedBackend(MemoryBackend):
    """Holds its first read until ``gate`` opens, so that everything submitted meanwhile
    is queued together (what the fetcher coalesces)."""

    def __init__(self) -> None:
        super().__init__("gated")
        self.gate = threading.Event()
        self.first = threading.Event()

    def read(self, digest, start=0, end=None):
        if not self.first.is_set():
            self.first.set()
            self.gate.wait(10)
        return super().read(digest, start, end)


@settings(max_examples=40)
@given(ranges=st.lists(st.tuples(st.integers(0, SIZE - 1), st.integers(1, 300)),
                       min_size=1, max_size=25),
       gap=st.integers(0, 200), limit=st.integers(64, 2048))
def test_coalesced_requests_deliver_each_range_once_within_limits(ranges, gap, limit):
    b = GatedBackend()
    data = bytes(i * 7 % 256 for i in range(SIZE))
    d = b.put(data)
    src = BlobSource(b, d, SIZE)
    cfg = FetchConfig(max_inflight=1, connections_per_host=1, coalesce_gap_bytes=gap,
                      max_coalesced_bytes=limit, part_bytes=1 << 20)
    wanted = sorted({(s, min(s + n, SIZE)) for s, n in ranges})
    other = b.put(b"the blob the first request holds the only connection with")
    with Fetcher(cfg) as f:
        blocker = f.submit(BlobSource(b, other), 0, 1)
        assert b.first.wait(10)
        futures = f.submit_many([(src, s, e) for s, e in wanted], priority=Priority.PREFETCH)
        b.gate.set()
        got = [fut.result(10) for fut in futures]
        blocker.result(10)
        counters = f.counters()
    assert got == [data[s:e] for s, e in wanted]
    reads = [(r.start, r.end) for r in b.reads if r.digest == d]
    assert counters["coalesced"] == len(wanted) - len(reads)
    for s, e in wanted:                         # every range inside a request
        assert any(a <= s and e <= z for a, z in reads)
    for a, z in reads:                          # a request is a chain of wanted ranges
        assert chained(wanted, a, z, gap)
        if (a, z) not in wanted:                # merged: within the limit
            assert z - a <= limit


def chained(wanted: list[tuple[int, int]], a: int, z: int, gap: int) -> bool:
    """Whether wanted ranges lead from ``a`` to ``z``, each starting at most ``gap`` bytes
    after the previous one ends (and not before it)."""
    ends = {e for s, e in wanted if s == a and e <= z}
    frontier = set(ends)
    while frontier:
        e = frontier.pop()
        for s2, e2 in wanted:
            if 0 <= s2 - e <= gap and e2 <= z and e2 not in ends:
                ends.add(e2)
                frontier.add(e2)
    return z in ends
