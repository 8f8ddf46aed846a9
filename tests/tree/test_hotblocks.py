"""Hot sets at block granularity: the recorder notes which blocks of each chunk a start
reads, profiles merge them, older profiles (whole chunks) still read, and the pre-read
follows the blocks; the tree's block table (bound to the TOC) checks each block."""

from __future__ import annotations

import json
import os

import pytest
import zstandard

from bootseer.errors import DigestMismatch
from bootseer.tree import blocks
from bootseer.tree import format as fmt
from bootseer.tree import profile as prof
from bootseer.tree.blob import BlobLayout
from bootseer.tree.preread import HotRange, hot_ranges
from bootseer.tree.record import BLOCK, AccessRecorder
from bootseer.tree.toc import ChunkRef, Entry, Toc, TreeFormatError

MiB = 1 << 20


def test_recorder_notes_the_blocks_read_in_first_access_order():
    rec = AccessRecorder("t1", timeout_s=None)
    rec("c1", "/a", MiB, False, 5 * BLOCK + 10, 5 * BLOCK + 4096)   # a 4 KiB touch
    rec("c1", "/a", MiB, True, 0, 2 * BLOCK)                         # two blocks
    rec("c1", "/a", MiB, True, 5 * BLOCK, 5 * BLOCK + 1)             # again: no new block
    rec("c2", "/b", 3000)                                            # whole small chunk
    p = rec.profile()
    assert p["block_size"] == BLOCK and p["blocks"] == {"c1": [5, 0, 1], "c2": [0]}
    assert rec.first_bytes == MiB + 3000 and rec.block_bytes == 3 * BLOCK + 3000
    assert prof.hot_bytes(p) == {"chunk_bytes": MiB + 3000, "block_bytes": 3 * BLOCK + 3000}


def _p(chunks, blocks=None, runs=1):
    p = {"kind": "bootseer.profile", "tree": "t1", "runs": runs,
         "chunks": [[d, first, 1, "/f", MiB] for d, first in chunks]}
    if blocks is not None:
        p.update(block_size=BLOCK, blocks=blocks)
    return p


def test_merge_unites_block_lists_and_an_old_profile_makes_its_chunks_whole():
    a = _p([("c1", 0.1), ("c2", 0.2)], {"c1": [3, 1], "c2": [0]})
    b = _p([("c1", 0.3), ("c3", 0.4)], {"c1": [1, 7], "c3": [2]})
    m = prof.merge([a, b])
    assert m["blocks"] == {"c1": [3, 1, 7], "c2": [0], "c3": [2]}
    assert prof.hot_bytes(m)["block_bytes"] == 5 * BLOCK
    old = _p([("c2", 0.1)])   # recorded before block lists: c2 was read whole
    m2 = prof.merge([m, old])
    assert m2["blocks"] == {"c1": [3, 1, 7], "c3": [2]}
    assert prof.hot_bytes(m2) == {"chunk_bytes": 3 * MiB, "block_bytes": 4 * BLOCK + MiB}
    # profiles all without blocks merge as before, with no block lists at all
    plain = prof.merge([old, _p([("c9", 0.2)])])
    assert "blocks" not in plain and prof.hot_bytes(plain)["block_bytes"] == 2 * MiB
    # another block size cannot be united: those chunks count whole
    other = {**_p([("c1", 0.5)]), "block_size": 2 * BLOCK, "blocks": {"c1": [0]}}
    assert "c1" not in prof.merge([m, other])["blocks"]


def test_malformed_block_lists_are_refused_with_a_hint():
    for bad in ({"block_size": 1000, "blocks": {}},
                {"block_size": BLOCK, "blocks": {"c1": ["x"]}},
                {"block_size": BLOCK, "blocks": [1]}):
        with pytest.raises(prof.ProfileError, match="record it again"):
            prof.check({**_p([("c1", 0.1)]), **bad}, "t1")
    with pytest.raises(prof.ProfileError, match="another image"):
        prof.check(_p([("c1", 0.1)], {"c1": [0]}), "t2")


def test_preread_ranges_follow_the_blocks_and_old_profiles_read_whole_chunks():
    refs = (ChunkRef("c1", 0, 0, 1, MiB), ChunkRef("c2", 0, 1, 1, MiB // 2))
    toc = Toc(MiB, ("p",), (Entry("/", "d", 0o755, 0, 0, 0.0, 0),
                            Entry("/f", "f", 0o644, 0, 0, 0.0, MiB + MiB // 2, chunks=refs)))
    lay, hot = BlobLayout(toc), ["c1", "c2"]
    assert hot_ranges(lay, hot) == [HotRange("c1", "/f", 0, MiB),
                                    HotRange("c2", "/f", MiB, MiB // 2)]
    p = _p([("c1", 0.1), ("c2", 0.2)], {"c1": [4, 5, 6, 0], "c2": [7, 8, 9]})
    assert hot_ranges(lay, hot, p) == [
        HotRange("c1", "/f", 4 * BLOCK, 3 * BLOCK, (4, 5, 6)),
        HotRange("c1", "/f", 0, BLOCK, (0,)),
        HotRange("c2", "/f", MiB + 7 * BLOCK, BLOCK, (7,))]   # blocks 8, 9 lie past its end


def _tree(tmp_path, **kw):
    from bootseer.store import open_store
    from bootseer.tree.build import TreeBuilder
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=MiB, **kw)
    data = os.urandom(MiB + 5000)
    b.add_file("/big", data)
    b.add_file("/small", b"tiny")
    digest = b.finish()
    return store, fmt.decode(store.read(digest), digest), data


def test_block_table_is_bound_to_the_tree_and_checks_each_block(tmp_path):
    store, toc, data = _tree(tmp_path)
    assert toc.blocks is not None and toc.blocks["block_size"] == BLOCK
    table = blocks.load(toc, store.read)
    assert table is not None
    c0, c1 = next(e for e in toc.entries if e.path == "/big").chunks or ()
    assert table.check(c0, 3, data[3 * BLOCK:4 * BLOCK])
    assert table.check(c1, 0, data[MiB:])                       # the short last block
    bad = bytearray(data[3 * BLOCK:4 * BLOCK])
    bad[100] ^= 1
    assert not table.check(c0, 3, bytes(bad))                   # one wrong byte
    assert not table.check(c0, 4, data[3 * BLOCK:4 * BLOCK])    # the right bytes, elsewhere
    assert not table.check(c1, 1, b"")                          # past the chunk's end
    # a store that answers with another table (one that would pass zeroed blocks) is
    # never trusted: the TOC names the table's digest
    forged = blocks.encode(toc.distinct_chunks(), {
        c.digest: bytes(blocks.HASH * -(-c.size // BLOCK)) for c in toc.distinct_chunks()})
    with pytest.raises(DigestMismatch):
        blocks.load(toc, lambda digest: forged)


def test_trees_without_a_block_table_keep_their_digest_and_bad_tables_are_refused(tmp_path):
    store, toc, _ = _tree(tmp_path, block_size=3 * 4096)   # does not tile a chunk: none
    assert toc.blocks is None and blocks.load(toc, store.read) is None
    assert b'"blocks"' not in zstandard.ZstdDecompressor().decompress(fmt.encode(toc))
    doc = {"v": 1, "kind": "bootseer.tree", "chunk_size": MiB, "packs": [], "meta": {},
           "entries": [{"path": "/", "type": "d", "mode": 0o755, "uid": 0, "gid": 0,
                        "mtime": 0, "size": 0}]}
    for bad in ({"digest": "sha256:" + "0" * 64, "block_size": 1000},
                {"digest": "nope", "block_size": BLOCK}, ["x"]):
        blob = zstandard.ZstdCompressor().compress(json.dumps({**doc, "blocks": bad}).encode())
        with pytest.raises(TreeFormatError, match="block table"):
            fmt.decode(blob, "sha256:" + "1" * 64)


def test_a_pack_keeps_the_first_hot_blocks_within_its_size_cap(tmp_path):
    from bootseer.config import CacheConfig
    from bootseer.store.cache import NodeCache
    from bootseer.tree import hotpack
    store, toc, data = _tree(tmp_path)
    cache = NodeCache(CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30))
    for c in toc.distinct_chunks():
        cache.offer(c.digest, store_chunk(store, toc, c), verified=False)
    big = next(e for e in toc.entries if e.path == "/big").chunks or ()
    p = {**_p([(big[0].digest, 0.1)], {big[0].digest: [2, 0, 1]}), "tree": "t1"}
    table = blocks.load(toc, store.read)
    assert table is not None
    full = hotpack.write(store, toc, table, p, cache)
    assert full is not None and full.entry["blocks"] == 3
    assert full.covered == {big[0].digest}
    written = hotpack.write(store, toc, table, p, cache, max_bytes=2 * BLOCK + 1000)
    assert written is not None and written.entry["blocks"] == 2   # blocks 2 and 0, in order
    assert written.covered == set()   # block 1 is left: the chunk is fetched whole
    capped = written.entry
    kept, dropped = hotpack.unpack("t1", toc, table, capped, store.read(capped["digest"]),
                                   cache)
    assert kept == {big[0].digest: {2, 0}} and dropped == 0
    assert hotpack.HotBlocks(table, kept, cache).get(big[0], 10, 5000) == data[10:5000]


def store_chunk(store, toc, ref) -> bytes:
    """A chunk's bytes from its pack in ``store``."""
    raw = store.read(toc.packs[ref.pack])[ref.offset:ref.end]
    return zstandard.ZstdDecompressor().decompress(raw, max_output_size=ref.size)
