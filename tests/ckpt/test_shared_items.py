"""The items every rank reads (ckpt/share.py): DCP spreads objects stored as bytes and
tensors stored whole over all the ranks' files. A node holds just those ranges of a file
its ranks read nothing else of, through the real mount and a real nginx whose access log
says what left the server, and streams the file once a read lands elsewhere in it."""

from __future__ import annotations

import json
import os
import pickle
import time
from concurrent.futures import Future

import pytest

from bootseer.ckpt import staging
from bootseer.ckpt.share import HOLD_MARGIN, PAGE, held_ranges, history_path
from bootseer.config import BootseerConfig
from tests.ckpt.test_node_share import complete, dcp_types, log_size, sent, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.torch]
MiB = 1 << 20
FILES = [f"__{r}_0.distcp" for r in range(4)]
SIZE = 3 * MiB + 77
# (fqn, file, offset, length): "w" in four parts, one per rank's file; "b" (a tensor stored
# whole) and "lr" (bytes) are in rank 1's file, far apart, as DCP balances them
SHARDED = [("w", FILES[r], 8 * PAGE, SIZE - 8 * PAGE) for r in range(4)]
SHARED = [("b", FILES[1], 100, 300), ("lr", FILES[1], 2 * MiB + 10, 50)]
START_WINDOW = 512 << 10   # the kernel reads ahead this much at a file's start (past a hold)


def dcp_metadata() -> bytes:
    """A ``.metadata`` as torch writes it, of :data:`SHARDED` and :data:`SHARED`."""
    torch, info, m = dcp_types()
    parts = [m.ChunkStorageMetadata(torch.Size([r * 4, 0]), torch.Size([4, 8]))
             for r in range(4)]
    whole = m.ChunkStorageMetadata(torch.Size([0]), torch.Size([75]))
    storage = {m.MetadataIndex("w", c.offsets): info(f, o, n)
               for c, (_, f, o, n) in zip(parts, SHARDED, strict=True)}
    storage[m.MetadataIndex("b", whole.offsets)] = info(*SHARED[0][1:])
    storage[m.MetadataIndex("lr")] = info(*SHARED[1][1:])
    return pickle.dumps(m.Metadata(state_dict_metadata={
        "w": m.TensorStorageMetadata(m.TensorProperties(), torch.Size([16, 8]), parts),
        "b": m.TensorStorageMetadata(m.TensorProperties(), torch.Size([75]), [whole]),
        "lr": m.BytesStorageMetadata()}, storage_data=storage))


@pytest.fixture
def checkpoint(tmp_path, nginx_factory):
    d = tmp_path / "dcp"
    d.mkdir()
    for name in FILES:
        (d / name).write_bytes(os.urandom(SIZE))
    (d / ".metadata").write_bytes(dcp_metadata())
    return d, nginx_factory(d, access_log=True)


def test_the_shared_items_and_the_ranges_held_for_them():
    from bootseer.ckpt.named_files import NotCheckpointMetadata, dcp_shared_items
    data = dcp_metadata()
    assert dcp_shared_items(data) == sorted((f, o, n) for _, f, o, n in SHARED)
    want = [(0, 400 + HOLD_MARGIN), (2 * MiB, 2 * MiB + 60 + HOLD_MARGIN)]
    assert held_ranges(data, dict.fromkeys(FILES, SIZE)) == {FILES[1]: want}
    # an item past the end is never held; a file its ranges cover a quarter of is streamed
    assert held_ranges(data, {**dict.fromkeys(FILES, SIZE), FILES[1]: 500_000}) == {}
    assert held_ranges(b"not a pickle", dict.fromkeys(FILES, SIZE)) == {}
    with pytest.raises(NotCheckpointMetadata):
        dcp_shared_items(pickle.dumps({"storage_data": {}}))


@pytest.mark.fuse
def test_a_file_read_for_its_shared_items_only_is_held_then_streamed(need_fuse, checkpoint,
                                                                    tmp_path):
    """A fresh node: its rank reads the shared items of rank 1's file through Python's
    buffered ``open()``, and only the held ranges leave the server (not the stripes they
    fall in); once it reads its part of that file, the file streams whole. The next start
    holds the shared items of a file this node read nothing else of, before any read."""
    from bootseer.ckpt.mount import mount_checkpoint
    src, server = checkpoint
    url = f"{server.url}/"
    config = BootseerConfig.from_env({}, overrides={
        "cache": {"dir": str(tmp_path / "node/cache")},
        "ckpt": {"stage": "reads", "stripe_bytes": 256 << 10}})
    held = sum(b - a for a, b in held_ranges(dcp_metadata(), dict.fromkeys(FILES, SIZE))[FILES[1]])
    want = (src / FILES[1]).read_bytes()
    mp = tmp_path / "mnt"
    mp.mkdir()

    def read_shared(name: str) -> None:
        with open(mp / name, "rb") as f:
            for _, _, offset, length in SHARED:
                f.seek(offset)
                assert f.read(length) == want[offset:offset + length]

    with mount_checkpoint(url, str(mp), config):   # a fresh node
        wait_for(lambda: ".metadata" in complete(config, url))
        read_shared(FILES[1])
        time.sleep(0.5)   # anything streaming after the reads has had its time
        assert held <= sent(server, FILES[1]) <= held + START_WINDOW < SIZE // 2
        assert FILES[1] not in complete(config, url)
        with open(mp / FILES[1], "rb") as f:   # its own part: a read elsewhere
            f.seek(MiB)
            assert f.read(MiB) == want[MiB:2 * MiB]
        wait_for(lambda: FILES[1] in complete(config, url))   # streamed whole
    assert sent(server, FILES[0]) == 0   # never opened

    # the next start: this node's ranks now read rank 0's part and rank 1's shared items
    staged_dir = staging.node_staging_dir(config)
    history = history_path(staged_dir, url)
    doc = json.loads(history.read_text())
    doc["files"] = {n: k for n, k in doc["files"].items() if n == FILES[1]}
    doc["ranges"] = [[FILES[1], o, o + n] for _, _, o, n in SHARED]
    history.write_text(json.dumps(doc))
    staging.gc(staged_dir, 0)
    since = log_size(server)
    with mount_checkpoint(url, str(mp), config):
        wait_for(lambda: sent(server, FILES[1], since) >= held)   # held before any read
        read_shared(FILES[1])
        time.sleep(0.5)
        assert held <= sent(server, FILES[1], since) <= held + START_WINDOW
        assert FILES[1] not in complete(config, url)


def test_a_held_range_that_failed_is_read_again(checkpoint, tmp_path):
    """A held range whose fetch failed is dropped: the reader gets the right bytes by an
    ordinary read; a read outside every held range runs the hook once. A file staged
    whole already is never held (its reads are local), and one staged whole since it was
    held gives its held memory back."""
    from bootseer.ckpt.engine import Engine
    from bootseer.ckpt.listing import RemoteDir
    from bootseer.config import CkptConfig
    src, server = checkpoint
    sources = RemoteDir(f"{server.url}/").walk()
    want = (src / FILES[2]).read_bytes()
    calls = []
    with Engine(CkptConfig(stripe_bytes=256 << 10), staging=str(tmp_path / "s")) as engine:
        f = engine.file(sources[FILES[2]])
        assert f.hold([(0, 8192), (MiB, MiB + 8192)], lambda: calls.append(1))
        failed: Future = Future()
        failed.set_exception(OSError("connection reset"))
        f._holds[1].future = failed
        assert f.read(MiB + 100, 50) == want[MiB + 100:MiB + 150]
        assert f.read(10, 5000) == want[10:5010] and calls == []
        assert f.read(4 * 8192, 10) == want[4 * 8192:4 * 8192 + 10] and calls == [1]
        assert f.read(5 * 8192, 10) == want[5 * 8192:5 * 8192 + 10] and calls == [1]
        assert engine.held_bytes == 8192   # the failed one went back
        staged = engine.file(sources[FILES[3]])
        for idx in range(staged.staged.nstripes):
            staged.wait_staged(idx)
        assert not staged.hold([(0, 8192)], lambda: calls.append(2))
        assert engine.held_bytes == 8192
        for idx in range(f.staged.nstripes):   # the held file streamed whole
            f.wait_staged(idx)
        assert f.read(10, 5000) == want[10:5010]
        assert engine.held_bytes == 0 and calls == [1]


@pytest.mark.parametrize("read_elsewhere", [False, True])
def test_the_history_holds_a_file_read_for_its_shared_items_only(checkpoint, tmp_path,
                                                                read_elsewhere):
    """At a start, a file the node's last load read only the shared items of (each read
    began in one) is held, not staged; one it also read another part of (ranks of another
    world size) has what it read staged in stripes, as before."""
    from bootseer.ckpt.engine import Engine
    from bootseer.ckpt.listing import RemoteDir
    from bootseer.ckpt.prefetch import start_plan
    from bootseer.ckpt.share import NodeReads
    from bootseer.config import CkptConfig
    src, server = checkpoint
    url = f"{server.url}/"
    sources = RemoteDir(url).walk()
    stripe = 256 << 10
    ranges = [[FILES[1], 0, 512 << 10], [FILES[1], 2 * MiB, 2 * MiB + 135168]]
    if read_elsewhere:
        ranges.append([FILES[1], MiB, MiB + 1000])
    with Engine(CkptConfig(stripe_bytes=stripe), staging=str(tmp_path / "staging")) as engine:
        path = history_path(engine.staging.dir, url)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"v": 1, "url": url, "files": {
            FILES[1]: sources[FILES[1]].key}, "ranges": ranges}))
        prefetch, _ = start_plan(engine, RemoteDir(url), node_reads=NodeReads(
            engine.staging.dir, url))
        assert prefetch.join(30)
        striped = {start for u, start, _ in prefetch.issued if u.endswith(FILES[1])}
        held = engine.file(sources[FILES[1]])._holds
        if read_elsewhere:
            assert not held and striped == {0, stripe, MiB, 2 * MiB}
        else:
            assert [(h.start, h.end) for h in held] == held_ranges(
                dcp_metadata(), dict.fromkeys(FILES, SIZE))[FILES[1]]
            assert striped == set()
