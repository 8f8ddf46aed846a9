"""The tree session's figures when the window closes while the prefetch is still running
(a job ready before its hot set is all local, or an eager pull of the whole image)."""

from __future__ import annotations

import json

import pytest

from bootseer.config import BootseerConfig, CacheConfig, StoreConfig
from bootseer.store import open_store
from bootseer.tree.build import TreeBuilder, add_directory
from bootseer.tree.session import TreeSession

pytestmark = pytest.mark.timeout(60)


class _GrowingWhileIterated(set):
    """The prefetch thread adding a chunk while figures() walks the set."""

    def __iter__(self):
        it = super().__iter__()
        first = next(it)
        self.add("sha256:" + "0" * 64)
        yield first
        yield from it   # the set changed size: RuntimeError, as with the real thread


def test_figures_while_the_prefetch_still_adds_chunks(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}").write_bytes(bytes([i]) * 5000)
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=1 << 20, pack_size=1 << 20)
    add_directory(b, src)
    tree = b.finish()
    config = BootseerConfig(store=StoreConfig(url=str(tmp_path / "store")),
                            cache=CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30))
    profile = {"v": 1, "kind": "bootseer.profile", "tree": tree, "runs": 1, "chunks": []}
    session = TreeSession(config, tree, str(tmp_path / "state"), profile=profile)
    session.prefetcher.wait(10)
    chunks = [c.digest for c in session.reader.all_chunks()]
    session.prefetcher.prefetched = _GrowingWhileIterated(chunks[:2])
    session.reader.chunk(session.reader.all_chunks()[0], "/f0")
    session.finish()
    figures = json.loads((tmp_path / "state/figures.json").read_text())
    assert figures["precision"] == 0.5 and figures["read_chunks"] == 1
