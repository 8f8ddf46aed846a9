"""Issue 18 item 15: a node cache that cannot take an entry (its disk is full, or its budget
is smaller than one chunk) costs only the caching: the verified bytes are served uncached
and that is logged once. Files in the cache that bootseer did not make are skipped, kept
and logged, never a reason to fail a read."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import time

import pytest

from bootseer.config import CacheConfig, FetchConfig
from bootseer.store import open_store
from bootseer.store.cache import NodeCache
from bootseer.store.fetch import Fetcher
from bootseer.tree.build import TreeBuilder
from bootseer.tree.reader import TreeReader

pytestmark = pytest.mark.timeout(120)
CHUNK = 64 << 10
FILES = {f"/d/f{i}": os.urandom(2 * CHUNK + 100 * i) for i in range(4)}


@pytest.fixture
def tree(tmp_path):
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=CHUNK, pack_size=1 << 20)
    for path, data in FILES.items():
        b.add_file(path, data)
    return store, b.finish()


def read_all(r: TreeReader) -> None:
    for path, data in FILES.items():
        assert r.read(path, len(data), 0) == data, path


def uncached_lines(caplog) -> int:
    return sum("serving uncached" in m for m in caplog.messages)


def test_budget_smaller_than_one_chunk_serves_uncached_and_logs_once(tmp_path, tree, caplog):
    store, digest = tree
    caplog.set_level(logging.WARNING, logger="bootseer.store.cache")
    cache = NodeCache(CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=CHUNK // 2))
    r = TreeReader(store, digest, Fetcher(FetchConfig(max_inflight=4)), cache)
    read_all(r)
    read_all(r)
    assert uncached_lines(caplog) == 1
    assert cache.stats()["uncached"] >= 8 and cache.stats()["bytes"] <= CHUNK // 2


@pytest.fixture
def tiny_disk(need_root, tmp_path):
    """A 64 KiB tmpfs, mounted for the test and unmounted after it."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "bootseer-test", str(mnt)],
                   check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_full_cache_disk_serves_uncached_and_logs_once(tmp_path, tree, tiny_disk, caplog):
    store, digest = tree
    caplog.set_level(logging.WARNING, logger="bootseer.store.cache")
    cache = NodeCache(CacheConfig(dir=str(tiny_disk / "cache"), budget_bytes=1 << 30))
    fd = os.open(tiny_disk / "filler", os.O_WRONLY | os.O_CREAT)   # the rest of the disk
    try:
        while os.write(fd, bytes(4096)):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    r = TreeReader(store, digest, Fetcher(FetchConfig(max_inflight=4)), cache)
    read_all(r)
    assert uncached_lines(caplog) == 1
    assert any("out of disk space" in m for m in caplog.messages)
    # nothing is left in the cache (a fetcher thread may still be unwinding a failed write)
    deadline = time.monotonic() + 10
    while left := [p for d in (tiny_disk / "cache/data").iterdir() for p in d.iterdir()]:
        assert time.monotonic() < deadline, left
        time.sleep(0.05)


def _view(store_url, digest, cache_dir, budget):
    from bootseer.tree.view import TreeMountView
    return TreeMountView(TreeReader(open_store(store_url), digest, Fetcher(),
                                    NodeCache(CacheConfig(dir=cache_dir, budget_bytes=budget))))


def test_budget_smaller_than_one_chunk_through_a_real_mount(need_fuse, tmp_path, tree):
    from bootseer.mount.fuse import mount
    store, digest = tree
    mp = tmp_path / "mnt"
    mp.mkdir()
    factory = functools.partial(_view, store.url, digest, str(tmp_path / "cache"), CHUNK // 2)
    with mount(factory, str(mp)):
        for path, data in FILES.items():
            assert (mp / path.lstrip("/")).read_bytes() == data   # was EIO


def plant_foreign(root) -> list:
    """What a user or another tool might leave in a cache directory."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "pins").mkdir(parents=True, exist_ok=True)
    planted = [root / "data/README", root / "data/ab/notes.txt", root / "data/zz/x",
               root / "pins/somedir/f", root / "pins/README"]
    for p in planted:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("not bootseer's")
    return planted


def test_foreign_entries_are_skipped_kept_and_logged(tmp_path, tree, caplog):
    store, digest = tree
    root = tmp_path / "cache"
    planted = plant_foreign(root)
    caplog.set_level(logging.WARNING, logger="bootseer.store.cache")
    budget = 3 * CHUNK   # smaller than the tree: every fill after the first few evicts
    cache = NodeCache(CacheConfig(dir=str(root), budget_bytes=budget))
    cache.pin("sha256:" + "1" * 64)
    r = TreeReader(store, digest, Fetcher(FetchConfig(max_inflight=4)), cache)
    read_all(r)
    read_all(r)
    s = cache.stats()
    assert s["evictions"] > 0 and s["bytes"] <= budget and s["uncached"] == 0
    assert all(p.exists() for p in planted)
    logged = [m for m in caplog.messages if "did not make" in m]
    for p in (root / "data/README", root / "data/ab/notes.txt", root / "data/zz/x",
              root / "pins/somedir", root / "pins/README"):
        assert sum(str(p) in m for m in logged) == 1, (p, logged)


def test_foreign_entries_through_a_real_mount(need_fuse, tmp_path, tree):
    from bootseer.mount.fuse import mount
    store, digest = tree
    plant_foreign(tmp_path / "cache")
    mp = tmp_path / "mnt"
    mp.mkdir()
    factory = functools.partial(_view, store.url, digest, str(tmp_path / "cache"), 3 * CHUNK)
    with mount(factory, str(mp)):
        for path, data in FILES.items():
            assert (mp / path.lstrip("/")).read_bytes() == data
