"""The node's decoded TOCs (``bootseer.tree.toc_cache``): a tree loads the same records
from it as from its JSON; a copy that is corrupt, of another tree or format, or not this
user's alone is never used (the TOC is decoded from its verified blob instead)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import pytest

from bootseer.config import CacheConfig
from bootseer.store import open_store
from bootseer.store.cache import NodeCache
from bootseer.store.fetch import Fetcher
from bootseer.tree import format as fmt
from bootseer.tree import toc_cache
from bootseer.tree.build import TreeBuilder
from bootseer.tree.reader import load_toc


def _tree(store, n: int, extra: bytes = b""):
    b = TreeBuilder(store, chunk_size=4096)
    b.add_dir("/d", mode=0o750)
    for i in range(n):
        b.add_file(f"/d/f{i}", b"x" * (i * 1000) + extra)
    b.add_symlink("/link", "d/f1")
    return b.finish()


@pytest.fixture
def node(tmp_path):
    store = open_store(str(tmp_path / "store"))
    cache = NodeCache(CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30))
    with Fetcher() as f:
        yield store, cache, f


def test_the_kept_copy_loads_the_same_records_and_is_used(node):
    store, cache, f = node
    tree = _tree(store, 12)
    toc = load_toc(store, tree, f, cache)
    assert toc_cache.load(cache.root, tree) is None   # nothing kept until a mount keeps it
    toc_cache.save(cache.root, tree, toc)
    path = toc_cache.path_of(cache.root, tree)
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert toc_cache.load(cache.root, tree) == toc == fmt.decode(store.read(tree), tree)
    (cache.root / "data").rename(cache.root / "gone")   # the TOC blob is not read again
    assert load_toc(store, tree, f, cache) == toc


def test_a_corrupt_copy_is_not_used(node, caplog):
    store, cache, f = node
    tree = _tree(store, 12)
    toc = load_toc(store, tree, f, cache)
    toc_cache.save(cache.root, tree, toc)
    path = toc_cache.path_of(cache.root, tree)
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF   # inside a chunk digest: still marshal's form, the sum fails
    path.write_bytes(bytes(data))
    assert toc_cache.load(cache.root, tree) is None
    assert "does not match its sum" in caplog.text
    assert load_toc(store, tree, f, cache) == toc   # decoded from the blob
    path.write_bytes(path.read_bytes()[:100])   # cut short
    assert toc_cache.load(cache.root, tree) is None


def test_a_copy_of_another_tree_is_not_used(node, caplog):
    caplog.set_level(logging.INFO, "bootseer.tree.toc_cache")
    store, cache, f = node
    tree, other = _tree(store, 12), _tree(store, 13, b"other")
    toc_cache.save(cache.root, other, load_toc(store, other, f, cache))
    shutil.copy(toc_cache.path_of(cache.root, other), toc_cache.path_of(cache.root, tree))
    assert toc_cache.load(cache.root, tree) is None
    assert "another format or tree" in caplog.text
    toc = load_toc(store, tree, f, cache)
    assert len(toc.entries) == 15 and toc == fmt.decode(store.read(tree), tree)


def test_a_copy_others_could_write_is_not_used(node, tmp_path):
    store, cache, f = node
    tree = _tree(store, 3)
    toc = load_toc(store, tree, f, cache)
    toc_cache.save(cache.root, tree, toc)
    path = toc_cache.path_of(cache.root, tree)
    os.chmod(path, 0o644)   # readable by others: not the node's private copy
    assert toc_cache.load(cache.root, tree) is None
    os.chmod(path, 0o600)
    os.chmod(path.parent, 0o777)   # a shared directory: anyone could have put it there
    assert toc_cache.load(cache.root, tree) is None
    os.chmod(path.parent, 0o700)
    link = toc_cache.path_of(cache.root, "sha256:" + "0" * 64)
    link.symlink_to(path)   # never followed
    assert toc_cache.load(cache.root, "sha256:" + "0" * 64) is None
    assert toc_cache.load(cache.root, tree) == toc


def test_the_node_keeps_the_most_recently_used_copies(node, monkeypatch):
    store, cache, f = node
    trees = [_tree(store, 2, b"%d" % i) for i in range(3)]
    for i, tree in enumerate(trees):
        toc_cache.save(cache.root, tree, load_toc(store, tree, f, cache))
        os.utime(toc_cache.path_of(cache.root, tree), (1000 + i, 1000 + i))
    assert toc_cache.load(cache.root, trees[0]) is not None   # used: the newest now
    monkeypatch.setattr(toc_cache, "KEEP", 2)
    toc_cache.save(cache.root, trees[2], load_toc(store, trees[2], f, cache))
    assert toc_cache.load(cache.root, trees[1]) is None   # the least recently used went
    assert toc_cache.load(cache.root, trees[0]) is not None


def test_a_mount_keeps_its_decoded_toc_at_its_process_exit(node):
    """Written after the job's start (a delay), or at the exit of a shorter process."""
    store, cache, f = node
    tree = _tree(store, 4)
    code = ("import sys; from bootseer.config import CacheConfig; from bootseer.store import "
            "open_store; from bootseer.store.cache import NodeCache; from bootseer.store.fetch "
            "import Fetcher; from bootseer.tree import toc_cache; from bootseer.tree.reader "
            "import load_toc; s, c = open_store(sys.argv[1]), NodeCache(CacheConfig("
            "dir=sys.argv[2], budget_bytes=1 << 30)); toc = load_toc(s, sys.argv[3], Fetcher(), "
            "c); toc_cache.save_later(c.root, sys.argv[3], toc); "
            "assert not toc_cache.path_of(c.root, sys.argv[3]).exists()")
    subprocess.run([sys.executable, "-c", code, store.url, str(cache.root), tree], check=True,
                   timeout=60)
    assert toc_cache.load(cache.root, tree) == fmt.decode(store.read(tree), tree)
