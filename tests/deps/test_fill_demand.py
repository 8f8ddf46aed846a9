"""The lazy restore's blob server against a real store over HTTP (nginx): a demanded
chunk arrives as parallel parts, the fill runs in small requests, and the blob it
completes holds the tree's bytes."""

from __future__ import annotations

import json
import math
import os

import pytest

from bootseer.config import BootseerConfig
from bootseer.deps.fill import DEMAND_PART_BYTES, FILL_REQUEST_BYTES, Fill, FillingBlob
from bootseer.store import open_store
from bootseer.store.client import StoreClient
from bootseer.tree.blob import BlobLayout
from bootseer.tree.build import TreeBuilder, add_directory
from bootseer.tree.reader import TreeReader

pytestmark = pytest.mark.timeout(60)
CHUNK = 1 << 20


@pytest.fixture
def served(tmp_path, nginx_factory):
    """Three incompressible 1 MiB files in a tree in a store served by nginx:
    (tree, store url, the files' bytes)."""
    src = tmp_path / "src"
    src.mkdir()
    data = [os.urandom(CHUNK) for _ in range(3)]
    for i, d in enumerate(data):
        (src / f"f{i}").write_bytes(d)
    b = TreeBuilder(open_store(str(tmp_path / "store")), chunk_size=CHUNK, pack_size=4 * CHUNK)
    add_directory(b, src)
    return b.finish(), nginx_factory(tmp_path / "store").url, data


def filling(tmp_path, served, node: str, *, start: bool) -> FillingBlob:
    tree, url, _ = served
    config = BootseerConfig.from_env(overrides={
        "store": {"url": url}, "cache": {"dir": str(tmp_path / node / "cache")}})
    client = StoreClient.of(config)
    layout = BlobLayout(TreeReader(client.store(), tree, client.fetcher, client.cache).toc)
    record = tmp_path / node / "record.json"
    blob = tmp_path / node / "cache" / "erofs" / f"{layout.key}.blob"
    blob.parent.mkdir(parents=True)
    record.write_text(json.dumps({"tree": tree}))
    return FillingBlob(config, Fill(tree=tree, key="k" * 64, layout=layout.key,
                                    blob=str(blob), record=str(record)), start=start)


def chunk_bytes(view: FillingBlob, served, i: int) -> bytes:
    """Slot ``i``'s bytes as the tree's file holds them."""
    path, n = view.layout.where[view.layout.refs[i].digest]
    return served[2][int(path.rsplit("f", 1)[1])][n * CHUNK:(n + 1) * CHUNK]


def test_a_demanded_chunk_arrives_as_parallel_parts(tmp_path, served):
    """One request for a whole chunk gets one connection's share of the link: the
    chunk's parts go out at once, each its own request."""
    view = filling(tmp_path, served, "n1", start=False)
    try:
        ref, off, want = view.layout.refs[1], view.layout.offsets[1], chunk_bytes(view, served, 1)
        assert view.read("/blob", 4096, off) == want[:4096]
        parts = math.ceil((ref.end - ref.offset) / DEMAND_PART_BYTES)
        assert parts >= 4
        assert view._demand.counters()["requests"] == parts
        assert view.read("/blob", 4096, off + 8192) == want[8192:12288]   # local: no request
        assert view._demand.counters()["requests"] == parts
        assert view.stats["demand_chunks"] == 1
    finally:
        view.close()


def test_the_fill_runs_in_small_requests_and_completes_the_blob(tmp_path, served):
    view = filling(tmp_path, served, "n2", start=True)
    try:
        assert view.done.wait(30), view.stats
        c = view._fill_lane.counters()
        assert c["requests"] >= math.ceil(c["bytes"] / FILL_REQUEST_BYTES) > 3
        with open(view.fill.blob, "rb") as b:
            for i, off in enumerate(view.layout.offsets):
                b.seek(off)
                assert b.read(CHUNK) == chunk_bytes(view, served, i)
    finally:
        view.close()
