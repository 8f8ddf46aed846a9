"""Property tests of tree packing: chunks packed into pack blobs lie inside their pack, do
not overlap and leave no gap; each file's chunks are its bytes in order (each a whole chunk
but the last); a chunk seen twice is stored once. And of the blob layout the kernel mounts:
chunk slots are block-aligned, disjoint, hot chunks first, and ``locate`` finds the slot of
every byte."""

from __future__ import annotations

import hashlib

import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bootseer.mount.erofs.layout import BLOCK, blocks_for
from bootseer.testing.fakes import MemoryBackend
from bootseer.tree import format as fmt
from bootseer.tree.blob import BlobLayout
from bootseer.tree.build import TreeBuilder
from bootseer.tree.preread import hot_ranges

# few distinct byte values: chunks repeat (dedup) and compress to varied sizes
contents = st.binary(max_size=3000).map(lambda b: bytes(x % 3 for x in b))
files = st.dictionaries(st.text("abc", min_size=1, max_size=4), contents, min_size=1,
                        max_size=6)


def build(tree: dict[str, bytes], chunk_size: int, pack_size: int):
    store = MemoryBackend()
    b = TreeBuilder(store, chunk_size=chunk_size, pack_size=pack_size)
    for name, data in tree.items():
        b.add_file(f"/{name}", data)
    digest = b.finish()
    return store, fmt.decode(store.read(digest), digest)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(files, st.sampled_from([64, 256, 1024]), st.integers(1, 4000))
def test_packs_hold_each_chunk_once_back_to_back(tree, chunk_size, pack_size):
    store, toc = build(tree, chunk_size, pack_size)
    packs = [store.read(d) for d in toc.packs]
    refs = {c for e in toc.entries if e.type == "f" for c in e.chunks or ()}
    assert len({r.digest for r in refs}) == len(refs)          # one place per chunk digest
    for i, pack in enumerate(packs):
        mine = sorted((r for r in refs if r.pack == i), key=lambda r: r.offset)
        assert [r.offset for r in mine] == [0, *(r.end for r in mine[:-1])]
        assert mine[-1].end == len(pack)      # no gap, no overlap, no tail
    assert all(0 <= r.pack < len(packs) for r in refs)
    dz = zstandard.ZstdDecompressor()
    for e in toc.entries:
        if e.type != "f":
            continue
        data = tree[e.path.lstrip("/")]
        raw = b""
        chunks = e.chunks or ()
        for n, c in enumerate(chunks):
            piece = dz.decompress(packs[c.pack][c.offset:c.end], max_output_size=c.size)
            assert len(piece) == c.size
            assert "sha256:" + hashlib.sha256(piece).hexdigest() == c.digest
            assert c.size == chunk_size or n == len(chunks) - 1
            raw += piece
        assert raw == data


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(files, st.sampled_from([BLOCK, 2 * BLOCK]), st.data())
def test_blob_layout_slots_are_aligned_disjoint_and_located(tree, chunk_size, data):
    _, toc = build(tree, chunk_size, 1 << 20)
    chunks = {c.digest: c for e in toc.entries if e.type == "f" for c in e.chunks or ()}
    hot = data.draw(st.lists(st.sampled_from(sorted(chunks)), max_size=5)) if chunks else []
    layout = BlobLayout(toc)
    assert sorted(c.digest for c in layout.refs) == sorted(chunks)
    # in TOC order whatever the profile: the layout, and so the metadata image, is the
    # tree's own
    assert [c.digest for c in layout.refs] == [c.digest for c in toc.distinct_chunks()]
    ranges = hot_ranges(layout, hot)
    assert [r.digest for r in ranges] == list(dict.fromkeys(hot))
    for r in ranges:   # where a file holds the hot chunk, in that file's coordinates
        e = next(e for e in toc.entries if e.path == r.path)
        assert e.chunks[r.offset // chunk_size].digest == r.digest
        assert r.length == chunks[r.digest].size
    ends = [*layout.offsets[1:], layout.size] if layout.refs else []
    for i, (c, start, end) in enumerate(zip(layout.refs, layout.offsets, ends, strict=True)):
        assert start % BLOCK == 0 and layout.block_of[c.digest] * BLOCK == start
        assert end - start == max(blocks_for(c.size), 1) * BLOCK    # room for the chunk, no more
        for off in (start, start + c.size // 2, end - 1):
            assert layout.locate(off) == i
    assert layout.size == layout.blocks * BLOCK
