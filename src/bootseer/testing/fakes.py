"""Fakes for the unit tier: a store backend in memory, a backend that fails on purpose, a
clock that moves only when told. With them the fetcher's retries, the cache's verification
and anything that waits can be tested with no directory, server or real sleep, so the
result never depends on how loaded the machine is.

``MemoryBackend`` keeps the contract of :class:`bootseer.store.backend.Backend` (the same
errors for a missing blob, a range past the end, a digest mismatch, a read-only store) and
records every read, so a test can assert which requests were made, not how long they took.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from bootseer.errors import BlobNotFound, FetchError, RangeError, ReadOnlyStore
from bootseer.store.digest import Digest, parse, sha256_digest, verify


@dataclass(frozen=True)
class Read:
    """One read a backend served (or refused): the blob and the range asked for."""

    digest: Digest
    start: int
    end: int | None


class MemoryBackend:
    """A store backend holding its blobs and refs in this process's memory."""

    def __init__(self, name: str = "mem", *, host: str | None = None, writable: bool = True):
        self.url = f"fake-memory://{name}"
        self.host = host or name
        self.writable = writable
        self._blobs: dict[Digest, bytes] = {}
        self._refs: dict[str, Digest] = {}
        self._lock = threading.Lock()
        self.reads: list[Read] = []
        """Every ``read`` call in the order served (thread-safe appends)."""

    def put(self, data: bytes) -> Digest:
        """Store ``data`` even when read-only (a test's set-up) and return its digest."""
        digest = sha256_digest(data)
        with self._lock:
            self._blobs[digest] = bytes(data)
        return digest

    def _blob(self, digest: Digest) -> bytes:
        with self._lock:
            data = self._blobs.get(digest)
        if data is None:
            raise BlobNotFound(f"blob {digest} not found in {self.url}", digest=digest,
                               url=self.url)
        return data

    def stat(self, digest: Digest) -> int:
        return len(self._blob(digest))

    def exists(self, digest: Digest) -> bool:
        with self._lock:
            return digest in self._blobs

    def read(self, digest: Digest, start: int = 0, end: int | None = None) -> bytes:
        with self._lock:
            self.reads.append(Read(digest, start, end))
        data = self._blob(digest)
        size = len(data)
        if start > size or (start == size and size > 0 and end != start):
            raise RangeError(f"range {start}-{end} outside blob {digest} of {size} bytes",
                             digest=digest, url=self.url, offset=start)
        return data[start:size if end is None else min(end, size)]

    def write(self, digest: Digest, data: bytes | BinaryIO, size: int | None = None) -> bool:
        parse(digest)
        if not self.writable:
            raise ReadOnlyStore(f"cannot write {digest}: {self.url} is read-only",
                                url=self.url)
        payload = data if isinstance(data, bytes) else data.read()
        verify(digest, payload, source=self.url)
        with self._lock:
            if digest in self._blobs:
                return False
            self._blobs[digest] = payload
            return True

    def list(self) -> Iterator[Digest]:
        with self._lock:
            return iter(sorted(self._blobs))

    def get_ref(self, name: str) -> Digest | None:
        with self._lock:
            return self._refs.get(name)

    def set_ref(self, name: str, digest: Digest, *, exclusive: bool = False) -> bool:
        parse(digest)
        if not self.writable:
            raise ReadOnlyStore(f"cannot set ref {name}: {self.url} is read-only",
                                url=self.url)
        with self._lock:
            if exclusive and name in self._refs:
                return False
            self._refs[name] = digest
            return True

    def delete_ref(self, name: str) -> None:
        with self._lock:
            self._refs.pop(name, None)

    def list_refs(self, prefix: str = "") -> Iterator[str]:
        with self._lock:
            return iter(sorted(n for n in self._refs if n.startswith(prefix)))

    def close(self) -> None:
        pass


def transient(read: Read) -> Exception:
    """The default failure: what a dropped connection raises (the fetcher retries it)."""
    return FetchError(f"injected failure reading {read.digest} [{read.start}, {read.end})",
                      digest=read.digest, offset=read.start)


@dataclass
class FailingBackend:
    """Another backend whose reads fail on purpose: the first ``fail_first`` reads, then
    every read for which ``fails(read)`` is true (by default none). Everything else is
    passed to ``inner``. ``failures`` counts the reads that failed."""

    inner: MemoryBackend
    fail_first: int = 0
    fails: Callable[[Read], bool] = lambda read: False
    error: Callable[[Read], Exception] = transient
    failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def host(self) -> str:
        return self.inner.host

    @property
    def writable(self) -> bool:
        return self.inner.writable

    def read(self, digest: Digest, start: int = 0, end: int | None = None) -> bytes:
        read = Read(digest, start, end)
        with self._lock:
            fail = self.fail_first > 0 or self.fails(read)
            if fail:
                self.fail_first = max(0, self.fail_first - 1)
                self.failures += 1
        if fail:
            raise self.error(read)
        return self.inner.read(digest, start, end)

    def stat(self, digest: Digest) -> int:
        return self.inner.stat(digest)

    def exists(self, digest: Digest) -> bool:
        return self.inner.exists(digest)

    def write(self, digest: Digest, data: bytes | BinaryIO, size: int | None = None) -> bool:
        return self.inner.write(digest, data, size)

    def list(self) -> Iterator[Digest]:
        return self.inner.list()

    def get_ref(self, name: str) -> Digest | None:
        return self.inner.get_ref(name)

    def set_ref(self, name: str, digest: Digest, *, exclusive: bool = False) -> bool:
        return self.inner.set_ref(name, digest, exclusive=exclusive)

    def delete_ref(self, name: str) -> None:
        self.inner.delete_ref(name)

    def list_refs(self, prefix: str = "") -> Iterator[str]:
        return self.inner.list_refs(prefix)

    def close(self) -> None:
        self.inner.close()


class FakeClock:
    """Stands in for the ``time`` module's clocks: ``monotonic``, ``time`` and
    ``perf_counter`` read one counter that only ``sleep`` and ``advance`` move. Installed
    with ``monkeypatch.setattr(module, "time", clock)`` in a module that does
    ``import time``; ``sleeps`` lists every sleep asked for, so a test asserts the waits
    (a backoff's growth, a deadline) without spending them."""

    def __init__(self, start: float = 1000.0, *, epoch: float = 1.7e9):
        self._now = start
        self._epoch = epoch - start
        self._lock = threading.Lock()
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    perf_counter = monotonic

    def time(self) -> float:
        with self._lock:
            return self._epoch + self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
