"""Digests: ``sha256:<64 lowercase hex>``, the only address of a blob."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import BinaryIO

from bootseer.errors import DigestMismatch, InvalidDigest

_RE = re.compile(r"sha256:[0-9a-f]{64}")
# Digests read from outside (an OCI layout, a manifest, a registry): OCI's registered
# algorithms. The hex is lowercase and of the algorithm's length, so a digest can never
# be a path (``sha256:../../x``) wherever it is joined into one.
_OCI_RE = re.compile(r"(sha256):([0-9a-f]{64})|(sha512):([0-9a-f]{128})")

Digest = str  # validated with parse(); a plain str keeps JSON and dict keys simple


def parse(digest: str) -> Digest:
    """Validate and return ``digest``; raise InvalidDigest otherwise."""
    if not isinstance(digest, str) or not _RE.fullmatch(digest):
        raise InvalidDigest(f"not a sha256 digest: {digest!r} (expected sha256:<64 hex>)",
                            digest=str(digest))
    return digest


def parse_oci(digest: object) -> tuple[str, str]:
    """(algorithm, hex) of a digest from outside: ``sha256:`` + 64 or ``sha512:`` + 128
    lowercase hex digits; InvalidDigest otherwise."""
    m = _OCI_RE.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise InvalidDigest(f"not a valid digest: {str(digest)[:100]!r} (expected sha256:<64 "
                            f"lowercase hex> or sha512:<128 lowercase hex>)",
                            digest=str(digest)[:100])
    return (m[1], m[2]) if m[1] else (m[3], m[4])


class VerifyingReader:
    """A binary file read through (a tar stream, say) while it is hashed; ``finish()``
    reads what the consumer left (a tar's end padding), then raises DigestMismatch unless
    every byte hashed to ``digest`` and, when given, numbered ``size``."""

    def __init__(self, f: BinaryIO, digest: str, *, size: int | None = None, source: str = ""):
        self._f, self.digest, self.size, self.source = f, digest, size, source
        algo, _ = parse_oci(digest)
        self._h = hashlib.new(algo)
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._h.update(data)
        self.count += len(data)
        return data

    def finish(self) -> None:
        while self.read(1 << 20):
            pass
        actual = f"{self.digest.split(':', 1)[0]}:{self._h.hexdigest()}"
        where = f" from {self.source}" if self.source else ""
        if actual != self.digest:
            raise DigestMismatch(f"blob {self.digest}{where} is corrupt: its bytes hash to "
                                 f"{actual}", digest=self.digest, url=self.source or None)
        if self.size is not None and self.count != self.size:
            raise DigestMismatch(f"blob {self.digest}{where} has {self.count} bytes, its "
                                 f"descriptor says {self.size}", digest=self.digest,
                                 url=self.source or None)


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
