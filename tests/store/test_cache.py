"""The node cache: budget + LRU + pins, verification, crash safety, single-flight across
threads and real processes."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from bootseer.config import CacheConfig
from bootseer.errors import CacheError, DigestMismatch
from bootseer.store import sha256_digest
from bootseer.store.cache import NodeCache

pytestmark = pytest.mark.timeout(60)


def blob(i: int, size: int = 1000) -> tuple[str, bytes]:
    data = bytes([i % 256]) * size
    return sha256_digest(data), data


def test_lru_under_budget_never_evicts_pinned(tmp_path):
    c = NodeCache(CacheConfig(dir=str(tmp_path), budget_bytes=3500))
    (d0, b0), (d1, b1), (d2, b2), (d3, b3) = [blob(i) for i in range(4)]
    c.put(d0, b0)
    c.pin(d0)
    c.put(d1, b1)
    time.sleep(0.01)
    c.put(d2, b2)
    time.sleep(0.01)
    assert c.get(d1) == b1          # d1 now more recent than d2
    c.put(d3, b3)                   # over budget: evict LRU unpinned = d2
    assert c.contains(d0) and c.contains(d1) and c.contains(d3) and not c.contains(d2)
    assert c.stats()["bytes"] <= 3500 and c.stats()["evictions"] == 1
    c.unpin(d0)


def test_all_pinned_is_a_clear_error(tmp_path):
    c = NodeCache(CacheConfig(dir=str(tmp_path), budget_bytes=2000))
    for i in range(2):
        d, b = blob(i)
        c.put(d, b)
        c.pin(d)
    d, b = blob(9)
    with pytest.raises(CacheError, match="pinned"):
        c.put(d, b)
    with pytest.raises(CacheError, match="exceeds the cache budget"):
        c.put(*blob(7, 5000))


def test_corrupt_bytes_never_stored(tmp_path):
    c = NodeCache(CacheConfig(dir=str(tmp_path), budget_bytes=10_000))
    d, _ = blob(1)
    with pytest.raises(DigestMismatch):
        c.put(d, b"garbage")
    assert not c.contains(d) and c.get(d) is None


def _concurrent_put(cache_dir, digest, data, start_evt):
    c = NodeCache(CacheConfig(dir=cache_dir, budget_bytes=10**7))
    start_evt.wait()
    c.put(digest, data)


@pytest.mark.slow
def test_concurrent_fills_across_threads_and_processes(tmp_path):
    """Several processes and threads filling one entry at once: one entry, counted once
    in the bytes in use, and the bytes are the right ones."""
    d, b = blob(5, 100_000)
    ctx = multiprocessing.get_context("fork")
    evt = ctx.Event()
    procs = [ctx.Process(target=_concurrent_put, args=(str(tmp_path / "c"), d, b, evt))
             for _ in range(3)]
    [p.start() for p in procs]
    c = NodeCache(CacheConfig(dir=str(tmp_path / "c"), budget_bytes=10**7))
    evt.set()
    threads = [threading.Thread(target=lambda: c.put(d, b)) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    [p.join(30) for p in procs]
    assert all(p.exitcode == 0 for p in procs)
    assert c.get(d) == b
    assert c.stats()["entries"] == 1
    assert int((tmp_path / "c/.evict.lock").read_text()) == len(b)


def _killed_writer(cache_dir, digest, data):
    c = NodeCache(CacheConfig(dir=cache_dir, budget_bytes=10**8))
    os.replace = lambda *a: os.kill(os.getpid(), 9)   # killed between write and rename
    c.put(digest, data)


def test_killed_filler_leaves_nothing_visible(tmp_path):
    d, b = blob(3, 50_000)
    p = multiprocessing.get_context("fork").Process(target=_killed_writer,
                                                    args=(str(tmp_path), d, b))
    p.start()
    p.join(20)
    assert p.exitcode == -9
    c = NodeCache(CacheConfig(dir=str(tmp_path), budget_bytes=10**8))
    assert not c.contains(d)
    c.put(d, b)   # the eviction lock was released by the kernel
    assert c.get(d) == b


def _fill(dir_: str, start: int, n: int) -> None:
    c = NodeCache(CacheConfig(dir=dir_, budget_bytes=10_500))
    for i in range(start, start + n):
        c.put(*blob(i))


@pytest.mark.slow
def test_budget_holds_across_processes_and_recovers_from_hand_deletion(tmp_path):
    """The bytes in use are shared through the lock file: two processes filling one cache
    never exceed the budget; an entry removed by hand only makes the figure err high,
    and the next full budget rescans instead of failing."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_fill, args=(str(tmp_path), k * 40, 40)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    c = NodeCache(CacheConfig(dir=str(tmp_path), budget_bytes=10_500))
    assert c.stats()["bytes"] <= 10_500
    for f in (tmp_path / "data").rglob("*"):
        if f.is_file():
            f.unlink()
    for i in range(100, 130):
        c.put(*blob(i))
    s = c.stats()
    assert s["bytes"] <= 10_500 and s["entries"] == 10
