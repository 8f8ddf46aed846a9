"""What the fetcher reads from: anything that serves byte ranges of one object."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from bootseer.store.backend import Backend
from bootseer.store.digest import Digest


@runtime_checkable
class RangeSource(Protocol):
    key: str
    """Identity of the bytes (a digest, or url+size+mtime): equal keys, equal bytes."""
    host: str
    """For the per-host connection cap."""
    size: int | None

    def read_range(self, start: int, end: int) -> bytes:
        """One request for ``[start, end)``. Transient failures raise FetchError."""


class BlobSource:
    """A blob of a store backend."""

    def __init__(self, backend: Backend, digest: Digest, size: int | None = None):
        self.backend, self.digest, self.size = backend, digest, size
        self.key = digest
        self.host = backend.host

    def read_range(self, start: int, end: int) -> bytes:
        return self.backend.read(self.digest, start, end)

    def __repr__(self) -> str:
        return f"BlobSource({self.backend.url}, {self.digest[:19]})"
