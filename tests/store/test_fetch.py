"""The fetcher: priorities and promotion, dedup, coalescing, per-host cap, retries with
backoff, deadlines, counters; and against real nginx."""

from __future__ import annotations

import os
import threading
import time

import pytest

from bootseer.config import FetchConfig
from bootseer.errors import BlobNotFound, DigestMismatch, FetchError, StoreError
from bootseer.store import open_store, sha256_digest
from bootseer.store.fetch import Fetcher, Hedge, Policy, Priority, fetch_blob
from bootseer.store.replicas import Replicas
from bootseer.store.source import BlobSource

pytestmark = pytest.mark.timeout(60)


class FakeSource:
    """An in-memory source that logs requests; can fail the first N reads or block."""

    def __init__(self, data: bytes, key="k", host="h", fail_first=0, gate=None):
        self.data, self.key, self.host, self.size = data, key, host, len(data)
        self.log: list[tuple[int, int]] = []
        self.fail_left, self.gate = fail_first, gate
        self.lock = threading.Lock()
        self.active = self.max_active = 0

    def read_range(self, start, end):
        with self.lock:
            self.log.append((start, end))
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            fail = self.fail_left > 0
            self.fail_left -= 1
        try:
            if self.gate is not None:
                self.gate.wait()
            time.sleep(0.01)
            if fail:
                raise FetchError("flaky")
            return self.data[start:end]
        finally:
            with self.lock:
                self.active -= 1


def test_demand_preempts_prefetch_and_promotes():
    gate = threading.Event()
    src = FakeSource(os.urandom(100_000), gate=gate)
    with Fetcher(FetchConfig(max_inflight=1, coalesce_gap_bytes=-1)) as f:
        first = f.submit(src, 0, 10, priority=Priority.PREFETCH)   # occupies the one worker
        time.sleep(0.05)
        queued = [f.submit(src, 1000 * i, 1000 * i + 10, priority=Priority.PREFETCH)
                  for i in range(1, 6)]
        urgent = f.submit(src, 50_000, 50_010, priority=Priority.DEMAND)
        again = f.submit(src, 5000, 5010, priority=Priority.DEMAND)  # promotes a queued one
        assert again is queued[-1]
        gate.set()
        assert urgent.result() == src.data[50_000:50_010]
        [q.result() for q in queued]
        first.result()
        order = src.log[1:]
        assert set(order[:2]) == {(50_000, 50_010), (5000, 5010)}  # both demands first
        assert len(src.log) == 7  # nothing fetched twice
        assert f.counters()["promoted"] == 1


def test_a_range_finishing_is_never_fetched_twice():
    """A submit of a range whose fetch is completing (here: from the done callback, the
    moment a promoted read-ahead checks it) gets the finished future, not a new read."""
    src = FakeSource(os.urandom(10_000))
    seen = []
    with Fetcher(FetchConfig(max_inflight=2)) as f:
        first = f.submit(src, 0, 100, priority=Priority.PREFETCH)
        first.add_done_callback(lambda fut: seen.append(f.submit(src, 0, 100)))
        assert first.result() == src.data[:100]
        deadline = time.time() + 5
        while not seen and time.time() < deadline:
            time.sleep(0.01)
        assert seen and seen[0].result() == src.data[:100]
        assert src.log == [(0, 100)]


def test_coalescing_and_parts():
    src = FakeSource(os.urandom(1_000_000))
    gate = threading.Event()
    blocker = FakeSource(b"x" * 10, key="other", gate=gate)
    with Fetcher(FetchConfig(max_inflight=1, part_bytes=100_000)) as f:
        hold = f.submit(blocker, 0, 10)
        time.sleep(0.05)
        futs = [f.submit(src, s, s + 1000, priority=Priority.PREFETCH)
                for s in range(0, 10_000, 1000)]
        gate.set()
        hold.result()
        assert b"".join(x.result() for x in futs) == src.data[:10_000]
        assert len(src.log) == 1 and f.counters()["coalesced"] == 9
        assert f.read(src, 0, 1_000_000) == src.data  # 10 parts
        assert f.counters()["stall_s"] > 0


def test_per_host_cap():
    src = FakeSource(os.urandom(2_000_000))
    with Fetcher(FetchConfig(max_inflight=16, connections_per_host=3, part_bytes=50_000,
                             coalesce_gap_bytes=-1)) as f:
        assert f.read(src, 0, 2_000_000) == src.data
    assert src.max_active <= 3


def test_retries_then_success_and_deadline():
    src = FakeSource(os.urandom(1000), fail_first=2)
    with Fetcher(FetchConfig(max_inflight=2, backoff_s=0.01, retries=5)) as f:
        assert f.read(src, 0, 1000) == src.data
        assert f.counters()["retries"] == 2
    dead = FakeSource(b"x" * 100, fail_first=10**6)
    with Fetcher(FetchConfig(max_inflight=2, backoff_s=0.01, retries=3)) as f:
        with pytest.raises(FetchError, match="after 4 attempts"):
            f.read(dead, 0, 100)
    with Fetcher(FetchConfig(max_inflight=2, backoff_s=0.5, retries=100, deadline_s=0.3)) as f:
        with pytest.raises(FetchError):
            f.read(FakeSource(b"x" * 10, fail_first=10**6), 0, 10)


def test_against_nginx_with_verification(tmp_path, nginx_factory):
    store = open_store(str(tmp_path / "s"))
    data = os.urandom(3_000_000)
    d = sha256_digest(data)
    store.write(d, data)
    server = nginx_factory(tmp_path / "s")
    remote = open_store(server.url)
    with Fetcher(FetchConfig(part_bytes=256 * 1024)) as f:
        assert fetch_blob(f, remote, d) == data
        assert f.counters()["requests"] >= 12
        with pytest.raises(BlobNotFound):
            fetch_blob(f, remote, "sha256:" + "1" * 64)
    # a corrupted blob on the server is detected
    path = tmp_path / "s/blobs/sha256" / d[7:9] / d[7:]
    os.chmod(path, 0o644)
    path.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # a real change, whatever data[0] is
    with Fetcher(FetchConfig()) as f:
        with pytest.raises(DigestMismatch, match=server.url.split("//")[1]):
            fetch_blob(f, remote, d)


def test_server_killed_mid_read_fails_cleanly(tmp_path, nginx_factory):
    store = open_store(str(tmp_path / "s"))
    data = os.urandom(8_000_000)
    d = sha256_digest(data)
    store.write(d, data)
    server = nginx_factory(tmp_path / "s", limit_rate="200k")
    remote = open_store(server.url)
    # nginx lets the first second of a request through unthrottled: 1 MB parts at 200 kB/s
    with Fetcher(FetchConfig(part_bytes=1_000_000, backoff_s=0.05, retries=2, timeout_s=2)) as f:
        t = threading.Timer(0.5, server.kill)
        t.start()
        with pytest.raises(FetchError):
            f.read(BlobSource(remote, d, len(data)), 0, len(data))
        t.join()


# -- lanes: one queue, a policy and counters per caller -----------------------------------------

def _policy(**kw) -> Policy:
    return Policy(**{"max_inflight": 8, "connections_per_host": 8, "part_bytes": 1 << 20,
                     "max_coalesced_bytes": 1 << 20, **kw})


def test_lanes_count_their_own_reads_and_close_alone():
    gate = threading.Event()
    blocker = FakeSource(b"x" * 10, key="blocker", gate=gate)
    src = FakeSource(os.urandom(10_000))
    with Fetcher(FetchConfig(max_inflight=1, coalesce_gap_bytes=-1)) as f:
        a, b = f.lane(), f.lane()
        hold = a.submit(blocker, 0, 10)          # occupies the one worker
        time.sleep(0.05)
        mine = a.submit(src, 0, 100, priority=Priority.PREFETCH)
        shared = b.submit(src, 0, 100)           # the same range: one read, both wait
        assert shared is mine
        only_a = a.submit(src, 200, 300, priority=Priority.PREFETCH)
        a.close()                                # fails what only a waits for
        with pytest.raises(FetchError, match="closed before the read ran"):
            only_a.result(5)
        with pytest.raises(FetchError, match="fetcher is closed"):
            a.submit(src, 0, 10)
        gate.set()
        assert hold.result(5) == b"x" * 10
        assert shared.result(5) == src.data[:100]
        assert b.read(src, 500, 600) == src.data[500:600]
        assert b.counters()["deduplicated"] == 1
        assert b.counters()["requests"] == 1 and a.counters()["requests"] == 2
        assert f.counters()["requests"] == 0     # the default lane read nothing


def test_a_yielding_lane_starts_nothing_while_a_demand_read_of_its_host_is_in_flight():
    """A background fill beside a reader waiting shares no link with it: its queued reads
    wait for the demand read to end; a lane that does not yield goes on meanwhile."""
    gate = threading.Event()
    wanted = FakeSource(os.urandom(1000), key="wanted", gate=gate)
    filled, other = FakeSource(os.urandom(1000), key="filled"), FakeSource(b"o" * 10, key="o")
    with Fetcher(FetchConfig(max_inflight=8, coalesce_gap_bytes=-1)) as f:
        demand, fill = f.lane(_policy()), f.lane(_policy(yields_to_demand=True))
        waiting = demand.submit(wanted, 0, 1000)
        deadline = time.monotonic() + 5
        while not wanted.active:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert f.lane(_policy()).submit(other, 0, 10, priority=Priority.BACKGROUND).result(5)
        held = fill.submit(filled, 0, 1000, priority=Priority.BACKGROUND)
        time.sleep(0.1)
        assert not held.done() and filled.log == []
        gate.set()
        assert waiting.result(5) == wanted.data
        assert held.result(5) == filled.data


def test_a_lanes_policy_caps_its_connections_per_host():
    src = FakeSource(os.urandom(400_000))
    with Fetcher(FetchConfig(max_inflight=16, coalesce_gap_bytes=-1)) as f:
        lane = f.lane(_policy(connections_per_host=2, part_bytes=20_000))
        assert lane.read(src, 0, 400_000) == src.data
    assert src.max_active <= 2
    assert len(src.log) == 20   # the lane's part size


class Replica(FakeSource):
    """A replica of one object: its own host; can be slow (until cancelled) or dead."""

    def __init__(self, data, host, *, slow=False, dead=False, fatal=False):
        super().__init__(data, key="obj", host=host)
        self.url = f"http://{host}/obj"
        self.slow, self.dead, self.fatal = slow, dead, fatal

    def read_range(self, start, end, cancel=None):
        with self.lock:
            self.log.append((start, end))
        if self.fatal:
            raise StoreError("changed on the server")
        if self.dead:
            raise FetchError("connection refused")
        if self.slow:
            assert cancel is not None and cancel.wait(10), "the loser was never cancelled"
            raise FetchError("cancelled")
        return self.data[start:end]


def test_replicas_fail_over_and_hedge():
    data = os.urandom(64_000)
    with Fetcher(FetchConfig(retries=0)) as f:
        plain = f.lane(_policy(part_bytes=4000))
        dead = Replicas([Replica(data, "a", dead=True), Replica(data, "b")])
        assert plain.read(dead, 0, len(data)) == data
        assert plain.counters()["failovers"] >= 1 and plain.counters()["hedged_reads"] == 0

        hedging = f.lane(_policy(part_bytes=4000, hedge=Hedge(multiple=3.0, min_s=0.05)))
        fast = Replicas([Replica(data, "c"), Replica(data, "d")])
        for s in range(0, len(data), 4000):   # the median of recent reads
            assert hedging.read(fast, s, s + 4000) == data[s:s + 4000]
        slow = Replicas([Replica(data, "e", slow=True), Replica(data, "f")])
        t0 = time.monotonic()
        assert hedging.read(slow, 0, len(data)) == data
        assert time.monotonic() - t0 < 5
        assert hedging.counters()["hedged_reads"] >= 1


def test_a_replica_whose_object_changed_fails_the_read():
    data = os.urandom(1000)
    with Fetcher(FetchConfig(retries=2, backoff_s=0.01)) as f:
        changed = Replicas([Replica(data, "a", fatal=True), Replica(data, "b")])
        with pytest.raises(StoreError, match="changed on the server"):
            f.read(changed, 0, 1000)
