"""Issue 18 item 5: the node cache is re-verified as it is read. A chunk or TOC corrupted or
truncated on disk after it was filled is dropped and fetched again, never served: through
a reader, a real mount and an environment restore; each says so in a log line."""

from __future__ import annotations

import functools
import logging
import os

import pytest

from bootseer.config import CacheConfig, FetchConfig
from bootseer.store import open_store
from bootseer.store.cache import NodeCache
from bootseer.store.fetch import Fetcher
from bootseer.tree.build import TreeBuilder
from bootseer.tree.reader import TreeReader

pytestmark = pytest.mark.timeout(120)
CHUNK = 64 << 10
DATA = os.urandom(3 * CHUNK + 1000)


@pytest.fixture
def tree(tmp_path):
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=CHUNK)
    b.add_file("/lib/data.bin", DATA)
    return store, b.finish()


def cache_of(tmp_path) -> NodeCache:
    return NodeCache(CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30))


def reader(store, digest, tmp_path) -> TreeReader:
    return TreeReader(store, digest, Fetcher(FetchConfig(max_inflight=4)), cache_of(tmp_path))


def fill(store, digest, tmp_path) -> list:
    """Read the whole file once (every chunk cached); return its chunk refs."""
    r = reader(store, digest, tmp_path)
    assert r.read("/lib/data.bin", len(DATA), 0) == DATA
    return r.entries["/lib/data.bin"].chunks


def damage(path, how: str) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x01
    else:   # truncate
        data = data[:len(data) // 3]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_damaged_cached_chunk_is_refetched_not_served(tmp_path, tree, how, caplog):
    store, digest = tree
    refs = fill(store, digest, tmp_path)
    entry = cache_of(tmp_path).path(refs[1].digest)
    damage(entry, how)
    caplog.set_level(logging.WARNING, logger="bootseer.store.cache")
    r = reader(store, digest, tmp_path)
    # a kernel-sized read inside the damaged chunk, then the whole file
    assert r.read("/lib/data.bin", 4096, CHUNK + 100) == DATA[CHUNK + 100:CHUNK + 4196]
    assert r.read("/lib/data.bin", len(DATA), 0) == DATA
    assert entry.read_bytes() == DATA[CHUNK:2 * CHUNK]          # refetched and cached again
    assert r.counters["chunks_fetched"] == 1
    assert any("corrupt on disk" in m and refs[1].digest in m for m in caplog.messages)


def test_damaged_cached_toc_is_refetched(tmp_path, tree, caplog):
    store, digest = tree
    fill(store, digest, tmp_path)
    toc = cache_of(tmp_path).path(digest)
    damage(toc, "flip")
    caplog.set_level(logging.WARNING, logger="bootseer.store.cache")
    r = reader(store, digest, tmp_path)
    assert r.read("/lib/data.bin", len(DATA), 0) == DATA
    assert toc.read_bytes() == store.read(digest)
    assert any("corrupt on disk" in m and digest in m for m in caplog.messages)


def _view(store_url, digest, cache_dir):
    from bootseer.tree.view import TreeMountView
    return TreeMountView(TreeReader(open_store(store_url), digest, Fetcher(),
                                    NodeCache(CacheConfig(dir=cache_dir, budget_bytes=1 << 30))))


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_through_a_real_mount(need_fuse, tmp_path, tree, how, capfd):
    from bootseer.mount.fuse import mount
    store, digest = tree
    refs = fill(store, digest, tmp_path)
    for ref in refs[:2]:
        damage(cache_of(tmp_path).path(ref.digest), how)
    damage(cache_of(tmp_path).path(digest), how)   # and the TOC
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount(functools.partial(_view, store.url, digest, str(tmp_path / "cache")), str(mp)):
        assert os.path.getsize(mp / "lib/data.bin") == len(DATA)
        assert (mp / "lib/data.bin").read_bytes() == DATA
    cache = cache_of(tmp_path)
    assert [cache.path(r.digest).read_bytes() for r in refs[:2]] == [DATA[:CHUNK],
                                                                  DATA[CHUNK:2 * CHUNK]]
    err = capfd.readouterr().err   # the server's log lines (its stderr is ours)
    assert err.count("corrupt on disk") == 3, err


def test_through_an_environment_restore(tmp_path, tree, caplog):
    from tests.security.test_hostile_tree import restore
    store, digest = tree
    refs = fill(store, digest, tmp_path)
    damage(cache_of(tmp_path).path(refs[0].digest), "flip")
    damage(cache_of(tmp_path).path(refs[2].digest), "truncate")
    caplog.set_level(logging.WARNING, logger="bootseer.store.cache")
    restore(tmp_path, store, digest, tmp_path / "env")
    assert (tmp_path / "env/lib/data.bin").read_bytes() == DATA
    assert sum("corrupt on disk" in m for m in caplog.messages) == 2


def test_verify_on_read_costs_less_than_decompressing(tmp_path):
    """The price of re-verifying: hashing a 1 MiB chunk next to decompressing it (a cache
    miss does both; a hit now hashes). Printed for the record; bounded loosely."""
    import glob
    import time

    import zstandard

    from bootseer.store.digest import sha256_digest
    chunk = b""
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
        chunk += open(path, "rb").read()   # real files, as compressible as images hold
        if len(chunk) >= 1 << 20:
            break
    chunk = chunk[:1 << 20]
    comp = zstandard.ZstdCompressor(level=3).compress(chunk)
    zd = zstandard.ZstdDecompressor()

    def best(fn, n=20):
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)
    t_hash = best(lambda: sha256_digest(chunk))
    t_unzstd = best(lambda: zd.decompress(comp, max_output_size=len(chunk)))
    print(f"1 MiB chunk: sha256 {t_hash * 1e3:.2f} ms, zstd decompress {t_unzstd * 1e3:.2f} ms")
    assert t_hash < 0.02   # well under a millisecond on any recent CPU; 20 ms is a fault
