"""Which blobs of a store nothing reaches, so that a store does not only grow.

Reachable: every blob a ref points at (or whose hex a ref's name carries), and, from each
reachable document (a tree's TOC, a profile, an environment manifest, any JSON), every
``sha256:<hex>`` it mentions, transitively. A TOC's packs are reached as data, not read.
The walk is conservative: a digest that merely appears in a reachable document is kept.
What is left, and older than a grace period (a convert in progress writes its blobs before
its ref), is unreferenced."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bootseer.errors import BlobNotFound
from bootseer.store.backend import Backend
from bootseer.store.digest import Digest

_DIGEST = re.compile(rb"sha256:[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-f]{64}")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SCAN_MAX_BYTES = 64 * 1024**2
"""Larger blobs are data (packs, layers), never documents that name other blobs."""


class DirectoryStore(Protocol):
    """A store whose blobs are files of this machine (a LocalBackend): the only kind
    :func:`remove` can delete from."""

    def path(self, digest: Digest) -> Path: ...


@dataclass(frozen=True)
class Unreferenced:
    digest: str
    size: int
    age_s: float | None   # None: the backend does not say when it was written


def _document(store: Backend, digest: str) -> bytes | None:
    """The text of a blob that may name others (JSON, or zstd-compressed JSON); None for
    data."""
    try:
        size = store.stat(digest)
    except BlobNotFound:
        return None
    if size == 0 or size > SCAN_MAX_BYTES:
        return None
    head = store.read(digest, 0, min(size, 4))
    if head[:1] in (b"{", b"["):
        return store.read(digest)
    if head == _ZSTD_MAGIC:
        import zstandard
        try:
            text: bytes = zstandard.ZstdDecompressor().decompress(store.read(digest),
                                                           max_output_size=1 << 31)
        except zstandard.ZstdError:
            return None
        return text if text[:1] in (b"{", b"[") else None
    return None


def _packs(text: bytes) -> set[str]:
    """The packs a tree's TOC names (data: reached, not read)."""
    import json
    if b'"bootseer.tree"' not in text:
        return set()
    try:
        toc = json.loads(text)
    except ValueError:
        return set()
    packs = toc.get("packs") if isinstance(toc, dict) else None
    return {p for p in packs if isinstance(p, str)} if isinstance(packs, list) else set()


def reachable(store: Backend, also: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """Every blob a ref (or a digest in ``also``: trees live readers use) reaches."""
    roots: set[str] = set(also)
    for name in store.list_refs(""):
        digest = store.get_ref(name)
        if digest:
            roots.add(digest)
        roots |= {f"sha256:{h}" for h in _HEX.findall(name)}
    seen: set[str] = set()
    data: set[str] = set()
    todo = list(roots)
    while todo:
        digest = todo.pop()
        if digest in seen:
            continue
        seen.add(digest)
        if digest in data:
            continue
        text = _document(store, digest)
        if text is None:
            continue
        packs = _packs(text)
        data |= packs
        for found in {m.decode() for m in _DIGEST.findall(text)} | packs:
            if found not in seen:
                todo.append(found)
    return seen


def unreferenced(store: Backend, *, min_age_s: float = 0.0,
                 in_use: set[str] | frozenset[str] = frozenset()) -> list[Unreferenced]:
    """Blobs nothing reaches, older than ``min_age_s`` where the backend tells the age;
    ``in_use``: trees live processes read (``store.live``), kept with what they reach."""
    keep = reachable(store, in_use)
    now = time.time()
    found: list[Unreferenced] = []
    for digest in store.list():
        if digest in keep:
            continue
        age = _age(store, digest, now)
        if age is not None and age < min_age_s:
            continue
        try:
            size = store.stat(digest)
        except BlobNotFound:   # removed meanwhile
            continue
        found.append(Unreferenced(digest, size, age))
    return found


def _age(store: Backend, digest: str, now: float) -> float | None:
    path = getattr(store, "path", None)
    if path is None:
        return None
    try:
        return now - os.stat(path(digest)).st_mtime
    except OSError:
        return None


def remove(store: DirectoryStore, blob: Unreferenced) -> bool:
    """Remove one unreferenced blob of a directory store (the only kind whose blobs this
    process can delete); False if it is gone already."""
    try:
        os.unlink(store.path(blob.digest))
        return True
    except FileNotFoundError:
        return False
