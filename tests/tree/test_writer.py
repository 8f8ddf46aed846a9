"""The one writer of chunks to disk (``bootseer.tree.writer.ChunkWriter``): chunks not
local are fetched once and decoded ahead; local ones come from the node cache; a chunk
written twice is fetched once; a blob is written from the node cache alone."""

from __future__ import annotations

import os

import pytest

from bootseer.config import CacheConfig
from bootseer.store import open_store
from bootseer.store.cache import NodeCache
from bootseer.store.fetch import Fetcher
from bootseer.tree.blob import BlobLayout, assemble, write_blob
from bootseer.tree.build import TreeBuilder
from bootseer.tree.reader import TreeReader
from bootseer.tree.writer import ChunkWriter, Fetched, write_at

CHUNK = 4096


@pytest.fixture
def tree(tmp_path):
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=CHUNK)
    a, c = os.urandom(3 * CHUNK + 5), os.urandom(CHUNK)
    b.add_file("/a", a)
    b.add_file("/b", a)   # the same chunks again
    b.add_file("/c", c)
    return store, b.finish(), {"/a": a, "/b": a, "/c": c}


def _cache(tmp_path) -> NodeCache:
    return NodeCache(CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30))


def _write_files(w: ChunkWriter, r: TreeReader, paths, out):
    for p in paths:
        fd = os.open(out / p.lstrip("/"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            offset = 0
            for ref in r.entries[p].chunks:
                offset += w.write(fd, ref, offset, p)
        finally:
            os.close(fd)


def test_each_chunk_is_fetched_once_and_local_ones_come_from_the_cache(tmp_path, tree):
    store, digest, files = tree
    out = tmp_path / "out"
    out.mkdir()
    with Fetcher() as f:
        r = TreeReader(store, digest, f, _cache(tmp_path))
        r.chunk(r.entries["/c"].chunks[0])   # now local: not fetched by the writer
        fetched_before = r.counters["chunks_fetched"]
        order = [ref for p in files for ref in r.entries[p].chunks]
        seen: list[int] = []
        with ChunkWriter(order, reader=r, progress=seen.append) as w:
            _write_files(w, r, files, out)
            got = w.fetched()
    for p, data in files.items():
        assert (out / p.lstrip("/")).read_bytes() == data
    assert got.chunks == 4 and got.bytes > 0 and got.last_at is not None
    assert r.counters["chunks_fetched"] == fetched_before   # the writer's fetches are its own
    assert sorted(seen) == [5] + [CHUNK] * 4   # each distinct chunk once, /c local


def test_a_blob_from_the_node_cache_alone(tmp_path, tree):
    store, digest, _ = tree
    cache = _cache(tmp_path)
    with Fetcher() as f:
        r = TreeReader(store, digest, f, cache)
        layout = BlobLayout(r.toc)
        dest = tmp_path / "blob"
        with pytest.raises(FileNotFoundError, match="not .or no longer. in the node cache"):
            assemble(layout, cache, str(dest))
        assert not dest.exists()
        for ref in layout.refs:
            r.chunk(ref)
        assemble(layout, cache, str(dest))
        blob = dest.read_bytes()
        assert len(blob) == layout.size
        for ref, off in zip(layout.refs, layout.offsets):
            assert blob[off:off + ref.size] == r.chunk(ref)
        # the same blob written with the chunks fetched by the writer
        fd = os.open(tmp_path / "blob2", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            r2 = TreeReader(store, digest, f)
            with ChunkWriter(layout.refs, reader=r2) as w:
                write_blob(layout, fd, w)
                assert w.fetched() == Fetched(len(layout.refs), w.fetched().bytes,
                                              w.fetched().last_at)
        finally:
            os.close(fd)
    assert (tmp_path / "blob2").read_bytes() == blob


def test_write_at_writes_everything_at_the_offset(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        write_at(fd, b"abc", 5)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"\0" * 5 + b"abc"


def test_a_writer_needs_a_source():
    with pytest.raises(ValueError):
        ChunkWriter([])
