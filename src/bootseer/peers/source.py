"""What a set is to peers: an ordered list of items, and a source behind them.

Peers move sets of content-addressed items (a tree's hot chunks, an environment's chunks, a
checkpoint's stripes) and know nothing else of them: the technique that owns the set (its
adapter) says in which order the items go, how an item is fetched from the origin, and
where verified bytes go. The order is part of the set's identity (``torrent.set_key``), so
every node must derive the same list from the same set.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from os import PathLike
from typing import Protocol


@dataclass(frozen=True)
class SetItem:
    """One item of a set: its digest (sha256 of ``size`` bytes, as the torrent holds it),
    and ``stored``, the bytes the origin sends for it (compressed, or the same)."""
    digest: str
    size: int
    stored: int


class ChunkSource(Protocol):
    """The adapter behind a set: the origin, and where this node keeps verified items."""

    def local_path(self, digest: str) -> str | PathLike | None:
        """A file on this node holding exactly the item's bytes (linked or copied into the
        seed copy, checked there), or None."""

    def submit(self, items: list[SetItem]) -> list[Future]:
        """Ask the origin for ``items`` (prefetch priority: demand reads go first); each
        future gives the bytes as they crossed the network."""

    def accept_origin(self, item: SetItem, raw: bytes) -> bytes:
        """An item from the origin: verify and keep it; returns its bytes as the torrent
        holds them (``size`` bytes whose sha256 is the digest). Raises when it fails."""

    def accept_peer(self, item: SetItem, data: bytes) -> None:
        """An item from peers, already checked against its digest: keep it."""
