"""The hot pack of a profile: the exact blocks a start read, compressed, in access order,
as one blob a fresh node fetches in one or a few large GETs instead of every hot chunk.

Written when a profile is published (:func:`bootseer.tree.profile.publish_recorded`, on
the node that has the chunks) and named in the profile (``"pack": {"digest", "bytes"}``).
A profile comes through a store ref, so the pack's own digest only proves the transfer:
every block is checked against the tree's block table (:mod:`bootseer.tree.blocks`,
whose digest the TOC records) before it is kept, and a block that fails is dropped (its
chunk comes the usual way when a read needs it). Ranges are keyed by (chunk digest, block
index), never by a blob offset, so the pack outlives any change of the kernel path's blob
layout.

Stored form: ``MAGIC``, a 4-byte big-endian header length, the JSON header
``{"kind", "tree", "block_size", "blocks": [[chunk digest, index, stored bytes], ...]}``,
then each block zstd-compressed, in the header's order. Kept blocks go to the node cache
under their own sha256 (the block table's digest), so they are re-verified when read
and the memory a server holds stays the cache's concern.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass

from bootseer.errors import DigestMismatch
from bootseer.store.digest import sha256_digest, verify
from bootseer.store.fetch import Priority, fetch_blob
from bootseer.tree import blocks
from bootseer.tree.blocks import BlockDigests
from bootseer.tree.toc import ChunkRef, Toc

log = logging.getLogger(__name__)
MAGIC = b"bootseer.hotpack.v1\n"
KIND = "bootseer.hotpack"
MAX_BYTES = 512 << 20   # a pack is fetched and checked in memory; later hot blocks go as chunks
_LEN = struct.Struct(">I")


def _wanted(profile: dict, by_digest: dict[str, ChunkRef], bsize: int):
    """(ref, block index) of each hot block in profile order; a chunk without a block
    list (an older run read it whole) gives all of its blocks."""
    if profile.get("block_size") not in (None, bsize):
        return
    lists = profile.get("blocks") or {}
    for row in profile["chunks"]:
        ref = by_digest.get(row[0])
        if ref is None:
            continue
        mine = lists.get(ref.digest)
        for b in range(-(-ref.size // bsize)) if mine is None else mine:
            if b * bsize < ref.size:
                yield ref, b


@dataclass(frozen=True, slots=True)
class Written:
    """A pack just written: the profile's ``pack`` entry, and the chunks whose every hot
    block it holds (a start that takes the pack fetches none of them whole)."""
    entry: dict
    covered: frozenset[str]


def write(store, toc: Toc, table: BlockDigests, profile: dict, cache,
          max_bytes: int = MAX_BYTES) -> Written | None:
    """Write the pack of ``profile``'s hot blocks from the chunks ``cache`` holds (each
    verified as it is read; a chunk not there is left out), the first ``max_bytes`` of
    them in profile order, and return what it holds, or None when no block was at
    hand."""
    import zstandard
    zc = zstandard.ZstdCompressor(level=3)
    bsize = table.block_size
    by_digest = {c.digest: c for c in toc.distinct_chunks()}
    rows, body, total, full = [], [], 0, False
    have: dict[str, bytes | None] = {}
    left_out: set[str] = set()   # chunks with a hot block not in the pack
    for ref, b in _wanted(profile, by_digest, bsize):
        if full:   # every later hot block is left to its chunk
            left_out.add(ref.digest)
            continue
        if ref.digest not in have:
            have[ref.digest] = cache.get(ref.digest, ref.size)   # verified, None if absent
        data = have[ref.digest]
        if data is None:
            left_out.add(ref.digest)
            continue
        z = zc.compress(data[b * bsize:(b + 1) * bsize])
        if total + len(z) > max_bytes:
            full = True
            left_out.add(ref.digest)
            continue
        rows.append([ref.digest, b, len(z)])
        body.append(z)
        total += len(z)
    if not rows:
        return None
    head = json.dumps({"kind": KIND, "tree": profile["tree"], "block_size": bsize,
                       "blocks": rows}, separators=(",", ":")).encode()
    blob = b"".join([MAGIC, _LEN.pack(len(head)), head, *body])
    digest = sha256_digest(blob)
    store.write(digest, blob)
    return Written({"digest": digest, "bytes": len(blob), "blocks": len(rows)},
                   frozenset(r[0] for r in rows) - left_out)


def unpack(toc_digest: str, toc: Toc, table: BlockDigests, pack: dict, blob: bytes, cache
           ) -> tuple[dict[str, set[int]], int]:
    """Check ``blob`` against the profile's ``pack`` entry, then each block against the
    block table; put the good ones in ``cache``. Returns (chunk digest -> indices kept,
    blocks dropped). DigestMismatch when the blob is not the pack (nothing is kept)."""
    import zstandard
    verify(pack["digest"], blob, source="the hot pack")
    try:
        if not blob.startswith(MAGIC):
            raise ValueError("no hot-pack header")
        (n,) = _LEN.unpack_from(blob, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        head = json.loads(blob[start:start + n])
        rows = head["blocks"]
        ok = head.get("kind") == KIND and head.get("tree") == toc_digest and head.get(
            "block_size") == table.block_size and isinstance(rows, list)
    except (ValueError, KeyError, TypeError, struct.error) as e:
        raise DigestMismatch(f"hot pack {pack['digest']} is unreadable: {e}",
                             digest=pack["digest"]) from e
    if not ok:
        raise DigestMismatch(f"hot pack {pack['digest']} is not one of tree {toc_digest[:19]} "
                             "with its block size", digest=pack["digest"])
    by_digest = {c.digest: c for c in toc.distinct_chunks()}
    zd = zstandard.ZstdDecompressor()
    kept: dict[str, set[int]] = {}
    dropped, pos = 0, start + n
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and type(row[2]) is int
                and row[2] >= 0):
            raise DigestMismatch(f"hot pack {pack['digest']} has a malformed row {row!r}",
                                 digest=pack["digest"])
        digest, index, stored = row
        piece, pos = blob[pos:pos + stored], pos + stored
        ref = by_digest.get(digest) if type(digest) is str else None
        try:
            data = zd.decompress(piece, max_output_size=table.block_size)
        except zstandard.ZstdError:
            data = b""
        if ref is None or type(index) is not int or not table.check(ref, index, data):
            dropped += 1
            continue
        cache.offer(block_digest(table, ref, index), data, verified=True)
        kept.setdefault(ref.digest, set()).add(index)
    return kept, dropped


def block_digest(table: BlockDigests, ref: ChunkRef, index: int) -> str:
    """The block's own content digest (its node-cache key)."""
    return "sha256:" + table.digest(ref, index).hex()


class HotBlocks:
    """The hot blocks a pack brought, as the reader serves them: ``get(ref, lo, hi)`` is
    bytes ``lo:hi`` of the chunk when every block they span is present (re-verified from
    the node cache), else None (the chunk path serves)."""

    def __init__(self, table: BlockDigests, kept: dict[str, set[int]], cache):
        self.table, self.kept, self.cache = table, kept, cache

    def get(self, ref: ChunkRef, lo: int, hi: int) -> bytes | None:
        have = self.kept.get(ref.digest)
        if not have or hi <= lo:
            return None
        bs = self.table.block_size
        first, last = lo // bs, (min(hi, ref.size) - 1) // bs
        if any(b not in have for b in range(first, last + 1)):
            return None
        parts = []
        for b in range(first, last + 1):
            data = self.cache.get(block_digest(self.table, ref, b),
                                  min(bs, ref.size - b * bs))
            if data is None:   # evicted (or bad on disk): the chunk path serves
                have.discard(b)
                return None
            parts.append(data)
        return b"".join(parts)[lo - first * bs:hi - first * bs]



def fetch(reader, profile: dict) -> tuple[HotBlocks, dict[str, set[int]], int] | None:
    """Fetch and check ``profile``'s pack for ``reader``'s tree (one blob, a few large
    GETs at PREFETCH priority) and return (the blocks to serve, the chunks now needing no
    fetch of their own: digest -> hot blocks, blocks dropped); None when the profile has
    no pack or the tree no block table. Raises what the fetch or the checks raise
    (DigestMismatch for a pack that is not the profile's)."""
    pack, toc, cache = profile.get("pack"), reader.toc, reader.cache
    if not pack or toc.blocks is None or cache is None:
        return None

    def read(digest: str) -> bytes:
        data = cache.get(digest)
        if data is None:
            data = fetch_blob(reader.fetcher, reader.store, digest, priority=Priority.PREFETCH)
            cache.offer(digest, data, verified=True)
        return data
    table = blocks.load(toc, read)
    if table is None:
        return None
    blob = fetch_blob(reader.fetcher, reader.store, pack["digest"], priority=Priority.PREFETCH,
                      verify=False)   # unpack checks it, then every block
    kept, dropped = unpack(reader.digest, toc, table, pack, blob, cache)
    by_digest = {c.digest: c for c in toc.distinct_chunks()}
    wanted: dict[str, set[int]] = {}
    for ref, b in _wanted(profile, by_digest, table.block_size):
        wanted.setdefault(ref.digest, set()).add(b)
    covered = {d: w for d, w in wanted.items() if w <= kept.get(d, set())}
    return HotBlocks(table, kept, cache), covered, dropped
