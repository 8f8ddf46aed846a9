"""The narrow protocol every store backend implements.

Backends only move bytes; verification, caching, retries and concurrency live above
them (cache.py, fetch.py). A backend must be safe to call from many threads at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import BinaryIO, Protocol, runtime_checkable

from bootseer.errors import BlobNotFound, FetchError
from bootseer.store.digest import Digest


def head_size(status: int, headers: Mapping[str, str], digest: Digest, url: str) -> int:
    """A blob's size from the answer to an HTTP ``HEAD`` of it at the store ``url``."""
    if status == 404:
        raise BlobNotFound(f"blob {digest} not found at {url}", digest=digest, url=url)
    if status != 200 or "content-length" not in headers:
        raise FetchError(f"HEAD of blob {digest} at {url}: HTTP {status}", digest=digest,
                         url=url)
    return int(headers["content-length"])


@runtime_checkable
class Backend(Protocol):
    url: str
    """Where this store lives, without credentials (safe to log)."""
    host: str
    """Key for the per-host connection cap ("local" for local directories)."""
    writable: bool

    def stat(self, digest: Digest) -> int:
        """Size in bytes; BlobNotFound if absent."""

    def exists(self, digest: Digest) -> bool: ...

    def read(self, digest: Digest, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the blob (``end=None``: to the end). Raises
        BlobNotFound, RangeError (start beyond the size), FetchError (transport)."""

    def write(self, digest: Digest, data: bytes | BinaryIO, size: int | None = None) -> bool:
        """Store a blob, verifying its bytes against ``digest`` on the way in: a mismatch
        raises DigestMismatch and stores nothing. Returns False if it already existed."""

    def list(self) -> Iterator[Digest]:
        """Every blob digest in the store (order unspecified)."""

    def get_ref(self, name: str) -> Digest | None:
        """The digest a named ref points to, or None."""

    def set_ref(self, name: str, digest: Digest, *, exclusive: bool = False) -> bool:
        """Point ``name`` at ``digest``. With ``exclusive`` only if ``name`` is absent
        (create-if-absent, used for leases): returns False when it already existed."""

    def delete_ref(self, name: str) -> None: ...

    def list_refs(self, prefix: str = "") -> Iterator[str]: ...

    def close(self) -> None: ...
