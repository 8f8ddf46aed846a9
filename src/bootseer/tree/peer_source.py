"""A tree's chunks as a set that peers move (``bootseer.peers.source``).

The set's order is pack order (the origin's reads of neighbours coalesce), each digest
once: every node derives the same items from the same chunks, whatever order it was given
them in (a recorded hot set's), so its torrent's key is the same everywhere. Items are the
chunks as the node cache holds them (uncompressed: an item's sha256 is its digest); the
origin is the tree reader (verified, cached), and chunks from peers go to the node cache.
"""

from __future__ import annotations

from bootseer.peers.source import SetItem
from bootseer.store.fetch import Priority
from bootseer.tree.reader import TreeReader


def set_items(refs) -> list[SetItem]:
    """The set of chunk refs (``[digest, pack, offset, stored size, size]``) as items, in
    pack order, each digest once."""
    items: dict[str, SetItem] = {}
    for r in sorted(refs, key=lambda r: (r.pack, r.offset, r.digest)):
        if r.digest not in items:
            items[r.digest] = SetItem(r.digest, r.size, r.stored)
    return list(items.values())


class TreeChunks:
    """The chunks ``refs`` of ``reader``'s tree as a set's source (``ChunkSource``)."""

    def __init__(self, reader: TreeReader, refs):
        self.reader = reader
        self.refs = {r.digest: r for r in refs}
        self.items = set_items(refs)

    def local_path(self, digest: str):
        cache = self.reader.cache
        return None if cache is None else cache.path(digest)

    def submit(self, items: list[SetItem]) -> list:
        return self.reader.submit_chunks([self.refs[i.digest] for i in items],
                                         Priority.PREFETCH)

    def accept_origin(self, item: SetItem, raw: bytes) -> bytes:
        return self.reader.store_chunk(self.refs[item.digest], raw)   # verified, cached

    def accept_peer(self, item: SetItem, data: bytes) -> None:
        if self.reader.cache is not None:   # just hashed by the transfer: once is enough
            self.reader.cache.offer(item.digest, data, verified=True)
