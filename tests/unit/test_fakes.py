"""The unit tier's fakes keep the contracts they stand in for: MemoryBackend the store
backend's (its errors included), FailingBackend fails exactly the reads it is told to,
FakeClock moves only when slept or advanced."""

from __future__ import annotations

import pytest

from bootseer.errors import BlobNotFound, DigestMismatch, FetchError, RangeError, ReadOnlyStore
from bootseer.store.backend import Backend
from bootseer.store.digest import sha256_digest
from bootseer.testing.fakes import FailingBackend, FakeClock, MemoryBackend, Read


def test_memory_backend_is_a_backend_with_its_errors():
    b = MemoryBackend("t")
    assert isinstance(b, Backend)
    data = b"0123456789"
    d = sha256_digest(data)
    assert b.write(d, data) is True
    assert b.write(d, data) is False                       # already there
    assert b.stat(d) == 10 and b.exists(d)
    assert b.read(d) == data and b.read(d, 2, 5) == b"234" and b.read(d, 8, 99) == b"89"
    with pytest.raises(RangeError):
        b.read(d, 11)
    missing = sha256_digest(b"other")
    with pytest.raises(BlobNotFound):
        b.read(missing)
    with pytest.raises(DigestMismatch):
        b.write(missing, data)
    assert not b.exists(missing)
    assert list(b.list()) == [d]
    assert b.reads == [Read(d, 0, None), Read(d, 2, 5), Read(d, 8, 99), Read(d, 11, None),
                       Read(missing, 0, None)]


def test_memory_backend_refs_and_read_only():
    b = MemoryBackend()
    d = b.put(b"x")
    assert b.set_ref("a/b", d) and not b.set_ref("a/b", d, exclusive=True)
    assert b.get_ref("a/b") == d and list(b.list_refs("a/")) == ["a/b"]
    b.delete_ref("a/b")
    assert b.get_ref("a/b") is None
    ro = MemoryBackend(writable=False)
    d2 = ro.put(b"seed")                                   # set-up writes still work
    assert ro.read(d2) == b"seed"
    with pytest.raises(ReadOnlyStore):
        ro.write(sha256_digest(b"y"), b"y")
    with pytest.raises(ReadOnlyStore):
        ro.set_ref("r", d2)


def test_failing_backend_fails_first_reads_then_chosen_ones():
    inner = MemoryBackend()
    d = inner.put(b"abcdef")
    b = FailingBackend(inner, fail_first=2, fails=lambda r: r.start == 4)
    assert isinstance(b, Backend)
    for _ in range(2):
        with pytest.raises(FetchError):
            b.read(d, 0, 2)
    assert b.read(d, 0, 2) == b"ab"
    with pytest.raises(FetchError):
        b.read(d, 4, 6)
    assert b.failures == 3
    assert inner.reads == [Read(d, 0, 2)]                  # failed reads never reach it
    gone = FailingBackend(inner, error=lambda r: BlobNotFound(r.digest), fail_first=1)
    with pytest.raises(BlobNotFound):
        gone.read(d)


def test_fake_clock_moves_only_when_told():
    c = FakeClock(start=10.0, epoch=100.0)
    assert c.monotonic() == 10.0 and c.time() == 100.0
    c.sleep(1.5)
    c.advance(0.5)
    assert c.monotonic() == c.perf_counter() == 12.0 and c.time() == 102.0
    assert c.sleeps == [1.5]
    with pytest.raises(ValueError):
        c.advance(-1)
