"""Digests: ``sha256:<64 lowercase hex>``, the only address of a blob."""

from __future__ import annotations

import hashlib
import re
from typing import BinaryIO, Iterable

from bootseer.errors import DigestMismatch, InvalidDigest

_RE = re.compile(r"sha256:[0-9a-f]{64}")

Digest = str  # validated with parse(); a plain str keeps JSON and dict keys simple


def parse(digest: str) -> Digest:
    """Validate and return ``digest``; raise InvalidDigest otherwise."""
    if not isinstance(digest, str) or not _RE.fullmatch(digest):
        raise InvalidDigest(f"not a sha256 digest: {digest!r} (expected sha256:<64 hex>)",
                            digest=str(digest))
    return digest


def hex_of(digest: Digest) -> str:
    return parse(digest)[7:]


def sha256_digest(data: bytes | bytearray | memoryview | Iterable[bytes]) -> Digest:
    h = hashlib.sha256()
    if isinstance(data, (bytes, bytearray, memoryview)):
        h.update(data)
    else:
        for part in data:
            h.update(part)
    return "sha256:" + h.hexdigest()


def file_digest(f: BinaryIO) -> tuple[Digest, int]:
    """Digest and size of a binary file object, read from its current position."""
    h = hashlib.sha256()
    n = 0
    while chunk := f.read(1 << 20):
        h.update(chunk)
        n += len(chunk)
    return "sha256:" + h.hexdigest(), n


def verify(digest: Digest, data: bytes | bytearray | memoryview, *, source: str = "") -> None:
    """Raise DigestMismatch unless ``data`` hashes to ``digest``."""
    actual = sha256_digest(data)
    if actual != digest:
        where = f" from {source}" if source else ""
        raise DigestMismatch(f"blob {digest}{where} is corrupt: its bytes hash to {actual}",
                             digest=digest, url=source or None)
