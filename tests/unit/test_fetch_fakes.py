"""The fetcher against the unit tier's fakes: parts, retries with backoff, the deadline and
the errors never retried, asserted on the requests made and the waits asked for (a fake
clock), never on elapsed time."""

from __future__ import annotations

import pytest

from bootseer.config import FetchConfig
from bootseer.errors import BlobNotFound, FetchError
from bootseer.store import fetch as fetch_module
from bootseer.store.fetch import Fetcher, fetch_blob
from bootseer.store.source import BlobSource
from bootseer.testing.fakes import FailingBackend, FakeClock, MemoryBackend, Read


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(fetch_module, "time", c)
    return c


def test_a_large_blob_goes_out_as_parts_that_cover_it():
    b = MemoryBackend()
    data = bytes(range(256)) * 40                        # 10240 bytes
    d = b.put(data)
    cfg = FetchConfig(part_bytes=4096, max_inflight=4)
    with Fetcher(cfg) as f:
        assert fetch_blob(f, b, d) == data
    assert sorted(b.reads, key=lambda r: r.start) == [
        Read(d, 0, 4096), Read(d, 4096, 8192), Read(d, 8192, 10240)]


def test_transient_failures_are_retried_with_growing_backoff(clock):
    inner = MemoryBackend()
    d = inner.put(b"payload")
    b = FailingBackend(inner, fail_first=3)
    cfg = FetchConfig(max_inflight=1, retries=5, backoff_s=0.1, backoff_max_s=5.0)
    with Fetcher(cfg) as f:
        assert fetch_blob(f, b, d) == b"payload"
        counters = f.counters()
    assert counters["retries"] == 3 and counters["errors"] == 3 and counters["requests"] == 4
    # attempt n waits backoff_s * 2**(n-1), jittered by a factor in [0.5, 1.5)
    assert len(clock.sleeps) == 3
    for n, s in enumerate(clock.sleeps, 1):
        assert 0.05 * 2 ** (n - 1) <= s < 0.15 * 2 ** (n - 1)


def test_retries_stop_at_the_limit(clock):
    inner = MemoryBackend()
    d = inner.put(b"x" * 10)
    b = FailingBackend(inner, fails=lambda r: True)
    with Fetcher(FetchConfig(max_inflight=1, retries=2)) as f:
        with pytest.raises(FetchError, match="after 3 attempts"):
            f.read(_source(b, d), 0, 10)
    assert b.failures == 3 and len(clock.sleeps) == 2


def test_retries_stop_at_the_deadline(clock):
    inner = MemoryBackend()
    d = inner.put(b"x" * 10)
    b = FailingBackend(inner, fails=lambda r: True)
    cfg = FetchConfig(max_inflight=1, retries=1000, backoff_s=1.0, backoff_max_s=1.0,
                      deadline_s=10.0)
    with Fetcher(cfg) as f:
        with pytest.raises(FetchError):
            f.read(_source(b, d), 0, 10)
    # no wait that would end past the deadline is started
    assert sum(clock.sleeps) <= 10.0
    assert 6 <= b.failures <= 21                          # waits of 0.5 .. 1.5 s each


def test_a_missing_blob_is_not_retried(clock):
    b = FailingBackend(MemoryBackend(), fail_first=1, error=lambda r: BlobNotFound(r.digest))
    d = MemoryBackend().put(b"elsewhere")
    with Fetcher(FetchConfig(max_inflight=1)) as f:
        with pytest.raises(BlobNotFound):
            f.read(_source(b, d), 0, 9)
        assert f.counters()["requests"] == 1
    assert clock.sleeps == []


def _source(backend, digest) -> BlobSource:
    return BlobSource(backend, digest, None)
