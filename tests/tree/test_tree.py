"""The tree format: build from a directory, read lazily, extract, mount; dedup; faults."""

from __future__ import annotations

import functools
import os
import stat

import pytest

from bootseer.config import CacheConfig, FetchConfig
from bootseer.errors import BlobNotFound, DigestMismatch
from bootseer.store import open_store
from bootseer.store.cache import NodeCache
from bootseer.store.fetch import Fetcher
from bootseer.tree import format as fmt
from bootseer.tree.build import TreeBuilder, TreeBuildError, add_directory
from bootseer.tree.extract import extract
from bootseer.tree.reader import TreeReader

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/lib").mkdir()
    big = os.urandom(3 * 1024 * 1024 + 17)
    (root / "usr/lib/libbig.so").write_bytes(big)
    (root / "usr/lib/copy.so").write_bytes(big)          # identical chunks: stored once
    (root / "usr/bin/tool").write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(root / "usr/bin/tool", 0o4755)
    os.symlink("tool", root / "usr/bin/alias")
    os.link(root / "usr/bin/tool", root / "usr/bin/hard")
    (root / "empty").write_bytes(b"")
    os.setxattr(root / "usr/bin/tool", "user.bootseer", b"x1")
    return root


def build(store, src, **kw):
    b = TreeBuilder(store, chunk_size=1 << 20, pack_size=2 << 20, **kw)
    add_directory(b, src)
    return b.finish(), b


def reader(store, digest, tmp_path, **kw):
    return TreeReader(store, digest, Fetcher(FetchConfig(max_inflight=8)),
                      NodeCache(CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30)), **kw)


def test_roundtrip_read_extract_dedup(tmp_path, src):
    store = open_store(str(tmp_path / "store"))
    digest, b = build(store, src)
    assert b.stats.dedup_chunks == 4 and len(b.packs) >= 2
    r = reader(store, digest, tmp_path)
    big = (src / "usr/lib/libbig.so").read_bytes()
    assert r.read("/usr/lib/libbig.so", 100, 1024 * 1024 - 50) == big[1024 * 1024 - 50:][:100]
    assert r.read("/usr/lib/copy.so", 10**8, 0) == big
    e = r.entry("/usr/bin/tool")
    assert e.mode == 0o4755 and r.entry("/usr/bin/hard").size == e.size
    assert r.entry("/usr/bin/alias").target == "tool"
    out = tmp_path / "out"
    extract(r, out)
    assert (out / "usr/lib/libbig.so").read_bytes() == big
    assert os.readlink(out / "usr/bin/alias") == "tool"
    assert os.stat(out / "usr/bin/hard").st_ino == os.stat(out / "usr/bin/tool").st_ino
    assert stat.S_IMODE(os.stat(out / "usr/bin/tool").st_mode) == 0o755   # set-id dropped
    assert os.getxattr(out / "usr/bin/tool", "user.bootseer") == b"x1"
    assert (out / "empty").read_bytes() == b""


def test_corrupt_pack_is_detected_never_cached(tmp_path, src):
    store = open_store(str(tmp_path / "store"))
    digest, b = build(store, src)
    pack = store.path(b.packs[0])
    os.chmod(pack, 0o644)
    data = bytearray(pack.read_bytes())
    data[10] ^= 0xFF
    pack.write_bytes(bytes(data))
    r = reader(store, digest, tmp_path)
    first = next(e for e in r.toc.entries if e.chunks)  # its chunk is at offset 0
    with pytest.raises(DigestMismatch):
        r.read(first.path, 100, 0)
    assert r.cache.stats()["entries"] == 1  # only the TOC


def test_unknown_tree_and_garbage_toc(tmp_path):
    store = open_store(str(tmp_path / "store"))
    with pytest.raises(BlobNotFound, match="no tree"):
        reader(store, "sha256:" + "3" * 64, tmp_path)
    from bootseer.store import sha256_digest
    junk = b"not a toc"
    store.write(sha256_digest(junk), junk)
    with pytest.raises(fmt.TreeFormatError, match="not a bootseer tree"):
        reader(store, sha256_digest(junk), tmp_path)


def test_path_traversal_refused(tmp_path):
    b = TreeBuilder(open_store(str(tmp_path / "s")))
    with pytest.raises(TreeBuildError, match="escapes"):
        b.add_file("/a/../../etc/passwd", b"x")


def _mounted_view(store, digest, tmp_path):
    from bootseer.tree.view import TreeMountView
    return TreeMountView(reader(store, digest, tmp_path))


def test_mounted_tree(need_fuse, tmp_path, src):
    from bootseer.mount.fuse import mount
    from bootseer.tree.view import TreeMountView
    store = open_store(str(tmp_path / "store"))
    digest, _ = build(store, src)
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount(functools.partial(_mounted_view, store, digest, tmp_path), str(mp)):
        assert (mp / "usr/lib/libbig.so").read_bytes() == (src / "usr/lib/libbig.so").read_bytes()
        assert os.readlink(mp / "usr/bin/alias") == "tool"
        assert sorted(os.listdir(mp / "usr/bin")) == ["alias", "hard", "tool"]
        assert os.getxattr(mp / "usr/bin/tool", "user.bootseer") == b"x1"
        assert stat.S_IMODE(os.stat(mp / "usr/bin/tool").st_mode) == 0o4755


def test_demand_miss_reads_ahead_the_small_files_beside_it(tmp_path):
    """Without a profile, the first miss in a directory queues its small neighbours (a
    Python import reads a package's files one by one); big files are left alone."""
    import time
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store)
    for i in range(6):
        b.add_file(f"/pkg/m{i}.py", os.urandom(3000))
    b.add_file("/pkg/big.bin", os.urandom(600 << 10))
    digest = b.finish()
    r = reader(store, digest, tmp_path)
    r.read("/pkg/m0.py", 3000, 0)
    small = [r.entries[f"/pkg/m{i}.py"].chunks[0] for i in range(1, 6)]
    deadline = time.time() + 10
    while not all(r.has_chunk(c) for c in small) and time.time() < deadline:
        time.sleep(0.02)
    assert all(r.has_chunk(c) for c in small)
    assert not r.has_chunk(r.entries["/pkg/big.bin"].chunks[0])


def test_cache_budget_smaller_than_the_tree_evicts_and_serves_right(tmp_path):
    """A node cache far smaller than the tree: every file still reads back exactly, and the
    cache never holds more than its budget."""
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=64 << 10, pack_size=1 << 20)
    files = {f"/d{i % 3}/f{i}": os.urandom(50_000 + 9_000 * i) for i in range(24)}
    for path, data in files.items():
        b.add_file(path, data)
    digest = b.finish()
    budget = 256 << 10
    cache = NodeCache(CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=budget))
    r = TreeReader(store, digest, Fetcher(FetchConfig(max_inflight=8)), cache)
    assert sum(len(d) for d in files.values()) > 10 * budget
    for _ in range(2):                      # a second pass reads evicted chunks again
        for path, data in files.items():
            got = b"".join(r.read(path, 100_000, off) for off in range(0, len(data), 100_000))
            assert got == data, path
    s = cache.stats()
    assert s["bytes"] <= budget and s["evictions"] > 0


def test_store_killed_mid_run_is_eio_not_a_hang(need_fuse, nginx_factory, tmp_path):
    """The store (nginx serving the store layout) dies while the tree is mounted: cached
    files still read, an uncached one fails with EIO after the retries, nothing hangs."""
    import errno
    import time
    local = open_store(str(tmp_path / "store"))
    b = TreeBuilder(local, chunk_size=64 << 10)
    b.add_file("/a.bin", os.urandom(200_000))
    b.add_file("/sub/b.bin", os.urandom(200_000))
    digest = b.finish()
    server = nginx_factory(tmp_path / "store", own=True)   # stopped below
    from bootseer.mount.fuse import mount
    mp = tmp_path / "mnt"
    mp.mkdir()
    factory = functools.partial(_http_tree_view, server.url, digest, str(tmp_path / "cache"))
    with mount(factory, str(mp)):
        assert len((mp / "a.bin").read_bytes()) == 200_000
        server.stop()
        assert len((mp / "a.bin").read_bytes()) == 200_000      # served from the cache
        t = time.monotonic()
        with pytest.raises(OSError) as e:
            (mp / "sub/b.bin").read_bytes()
        assert e.value.errno == errno.EIO and time.monotonic() - t < 30
    assert not os.path.ismount(mp)


def _http_tree_view(url, digest, cache_dir):
    from bootseer.tree.view import TreeMountView
    fetch = FetchConfig(retries=2, backoff_s=0.05, timeout_s=2, deadline_s=10)
    return TreeMountView(TreeReader(open_store(url), digest, Fetcher(fetch),
                                    NodeCache(CacheConfig(dir=cache_dir, budget_bytes=1 << 30))))


def test_prefetched_hot_chunks_wait_in_memory_for_their_first_read(tmp_path, src):
    """keep_fresh: a hot chunk stored by prefetch is served from memory at its first read
    (the kernel path's pre-read: no cache file read, no re-hash); other chunks, and hot
    ones pushed out by the byte bound, come from the node cache, verified."""
    from bootseer.store.fetch import Priority
    store = open_store(str(tmp_path / "store"))
    digest, _ = build(store, src)
    r = reader(store, digest, tmp_path)
    refs = r.entry("/usr/lib/libbig.so").chunks   # 1 MiB, 1 MiB, 1 MiB, 17 bytes
    r.keep_fresh([refs[0].digest, refs[1].digest, refs[3].digest], max_bytes=(1 << 20) + 100)
    for ref in refs:
        r.store_chunk(ref, r.submit_chunk(ref, Priority.PREFETCH).result())
    gets: list[str] = []
    real_get = r.cache.get
    r.cache.get = lambda d, size=None: gets.append(d) or real_get(d, size)
    big = (src / "usr/lib/libbig.so").read_bytes()
    assert r.chunk(refs[3], "/usr/lib/libbig.so") == big[3 << 20:]   # hot, kept
    assert r.chunk(refs[1], "/usr/lib/libbig.so") == big[1 << 20:2 << 20]   # hot, kept
    assert gets == []
    assert r.chunk(refs[0], "/usr/lib/libbig.so") == big[:1 << 20]   # dropped by the bound
    assert r.chunk(refs[2], "/usr/lib/libbig.so") == big[2 << 20:3 << 20]   # not hot
    assert gets == [refs[0].digest, refs[2].digest]
    assert not r._fresh and r._fresh_bytes == 0
