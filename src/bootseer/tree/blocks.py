"""Trusted digests of each chunk's sub-chunk blocks, so bytes fetched at a finer grain than
a chunk (a profile's hot blocks) can be checked before they are served.

A chunk digest covers a whole chunk only. The builder hashes every ``block_size`` block of
each distinct chunk and stores the table as a content-addressed object; the TOC names that
object's digest (``Toc.blocks``), so the table is bound to the tree's identity exactly as
the chunk digests are: it is trusted only after its bytes hash to the digest in the TOC,
never because a store ref points at it. A tree without the table keeps the whole-chunk
path.

The object is zstd-compressed: one JSON header line, then the raw 32-byte sha256 of each
block of each distinct chunk, in ``Toc.distinct_chunks`` order (``ceil(size / block_size)``
digests per chunk; an empty chunk has none).
"""

from __future__ import annotations

import hashlib
import json

from bootseer.store.digest import sha256_digest, verify
from bootseer.tree.record import BLOCK
from bootseer.tree.toc import ChunkRef, Toc, TreeFormatError

KIND = "bootseer.blocks"
HASH = 32   # bytes of one sha256


def usable(chunk_size: int, block_size: int = BLOCK) -> bool:
    """Whether ``block_size`` blocks tile a chunk of ``chunk_size`` (a smaller power of two)."""
    return 4096 <= block_size < chunk_size and chunk_size % block_size == 0 \
        and not block_size & (block_size - 1)


def digests_of(data: bytes, block_size: int = BLOCK) -> bytes:
    """The raw sha256 of each ``block_size`` block of one chunk's bytes, concatenated."""
    view = memoryview(data)
    return b"".join(hashlib.sha256(view[i:i + block_size]).digest()
                    for i in range(0, len(data), block_size))


def encode(order: list[ChunkRef], table: dict[str, bytes], block_size: int = BLOCK) -> bytes:
    """The stored object of ``table`` (chunk digest -> ``digests_of`` its bytes) for the
    distinct chunks ``order`` (a tree's ``distinct_chunks()``)."""
    import zstandard
    head = json.dumps({"kind": KIND, "block_size": block_size, "chunks": len(order)},
                      separators=(",", ":"), sort_keys=True).encode()
    return zstandard.ZstdCompressor(level=3).compress(
        head + b"\n" + b"".join(table[c.digest] for c in order))


def build(toc: Toc, table: dict[str, bytes], store, block_size: int = BLOCK) -> dict | None:
    """Write ``toc``'s block table to ``store``; the ``Toc.blocks`` that names it (None
    when ``block_size`` does not tile the chunks, or a chunk's hashes are missing)."""
    order = toc.distinct_chunks()
    if not usable(toc.chunk_size, block_size) or any(c.digest not in table for c in order):
        return None
    blob = encode(order, table, block_size)
    digest = sha256_digest(blob)
    store.write(digest, blob)
    return {"digest": digest, "block_size": block_size}


class BlockDigests:
    """A tree's verified block table: ``check(ref, index, data)`` says whether ``data``
    is block ``index`` of chunk ``ref``."""

    def __init__(self, block_size: int, spans: dict[str, memoryview]):
        self.block_size, self._spans = block_size, spans

    def digest(self, ref: ChunkRef, index: int) -> bytes:
        """The raw sha256 of block ``index`` of chunk ``ref`` (KeyError/IndexError if the
        table has no such block)."""
        span = self._spans[ref.digest]
        if not 0 <= index < len(span) // HASH:
            raise IndexError(f"chunk {ref.digest[:19]} has no block {index}")
        return bytes(span[index * HASH:(index + 1) * HASH])

    def check(self, ref: ChunkRef, index: int, data: bytes) -> bool:
        span = self._spans.get(ref.digest)
        lo = index * self.block_size
        if span is None or index < 0 or lo >= ref.size or len(data) != min(
                self.block_size, ref.size - lo):
            return False
        return hashlib.sha256(data).digest() == bytes(span[index * HASH:(index + 1) * HASH])


def decode(toc: Toc, blob: bytes) -> BlockDigests:
    """The table in ``blob``, which the caller verified against ``toc.blocks["digest"]``;
    TreeFormatError when it does not fit the TOC's chunks."""
    import zstandard
    assert toc.blocks is not None
    bsize = toc.blocks["block_size"]
    try:
        raw = zstandard.ZstdDecompressor().decompress(blob, max_output_size=1 << 31)
        head, _, body = raw.partition(b"\n")
        doc = json.loads(head)
    except (zstandard.ZstdError, ValueError) as e:
        raise TreeFormatError(f"block table {toc.blocks['digest']} is unreadable: {e}") from e
    order = toc.distinct_chunks()
    counts = [-(-c.size // bsize) for c in order]
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get(
            "block_size") != bsize or doc.get("chunks") != len(order) or len(
            body) != HASH * sum(counts):
        raise TreeFormatError(f"block table {toc.blocks['digest']} does not fit its tree's "
                              "chunks: rebuild the tree with `bootseer image convert`")
    view, spans, pos = memoryview(body), {}, 0
    for c, n in zip(order, counts, strict=True):
        spans[c.digest] = view[pos:pos + n * HASH]
        pos += n * HASH
    return BlockDigests(bsize, spans)


def load(toc: Toc, read) -> BlockDigests | None:
    """The tree's block table, verified against the digest its TOC records (``read``:
    digest -> bytes, e.g. a store's or a fetcher's); None for a tree without one."""
    if toc.blocks is None:
        return None
    digest = toc.blocks["digest"]
    blob = read(digest)
    verify(digest, blob, source="the block table of a tree")
    return decode(toc, blob)
