"""Each node stages what its own ranks read (ckpt/share.py), through the real mount and a
real nginx whose access log says which files left the server: a fresh node stages the small
files and, once the job reads one, that shard only; the next start on the node stages the
shard it read before any read; a node whose rank changed reads its new shard correctly and
streams it whole."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from bootseer.ckpt import staging
from bootseer.ckpt.listing import RemoteDir
from bootseer.ckpt.share import history_path
from bootseer.config import BootseerConfig

pytestmark = [pytest.mark.timeout(120), pytest.mark.fuse]
SHARDS = [f"__{r}_0.distcp" for r in range(4)]
MiB = 1 << 20


@pytest.fixture
def checkpoint(tmp_path, nginx_factory):
    d = tmp_path / "dcp"
    d.mkdir()
    for name in SHARDS:
        (d / name).write_bytes(os.urandom(3 * MiB + 77))   # large: past SMALL_FILE_BYTES
    (d / ".metadata").write_bytes(os.urandom(5000))
    return d, nginx_factory(d, access_log=True)


def served(server) -> set[str]:
    """The files nginx sent (by its access log)."""
    log = Path(server.workdir) / "access.log"
    text = log.read_text() if log.exists() else ""
    return {name for name in [*SHARDS, ".metadata"] if name in text}


def sent(server, name: str, since: int = 0) -> int:
    """Body bytes nginx sent of ``name`` in log lines from offset ``since``."""
    text = (Path(server.workdir) / "access.log").read_text()[since:]
    return sum(int(line.split('" ', 1)[1].split()[1]) for line in text.splitlines()
               if f"/{name} " in line)


def log_size(server) -> int:
    return len((Path(server.workdir) / "access.log").read_text())


def complete(config: BootseerConfig, url: str) -> set[str]:
    area = staging.StagingArea(staging.node_staging_dir(config))
    return {rel for rel, src in RemoteDir(url).walk().items() if area.is_complete(src.key)}


def wait_for(check, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_node_stages_the_shards_its_ranks_read(need_fuse, checkpoint, tmp_path):
    from bootseer.ckpt.mount import mount_checkpoint
    src, server = checkpoint
    url = f"{server.url}/"
    config = BootseerConfig.from_env({}, overrides={
        "cache": {"dir": str(tmp_path / "node/cache")},
        "ckpt": {"stage": "reads", "stripe_bytes": 256 << 10}})

    def read(mp: Path, name: str) -> None:
        got = (mp / name).read_bytes()
        assert hashlib.sha256(got).digest() == hashlib.sha256((src / name).read_bytes()).digest()

    mp = tmp_path / "mnt"
    mp.mkdir()
    report = tmp_path / "load.json"
    with mount_checkpoint(url, str(mp), config, stats_path=str(report)):   # a fresh node
        wait_for(lambda: ".metadata" in complete(config, url))
        read(mp, "__1_0.distcp")
    assert served(server) == {".metadata", "__1_0.distcp"}, served(server)
    import json
    assert json.loads(report.read_text())["staged_per_read"] < 1.1   # 4.0 staging it all
    assert history_path(staging.node_staging_dir(config), url).is_file()

    staging.gc(staging.node_staging_dir(config), 0)   # the staged copies go, the history stays
    assert complete(config, url) == set()
    since = log_size(server)
    with mount_checkpoint(url, str(mp), config):   # the next start: staged before any read
        wait_for(lambda: "__1_0.distcp" in complete(config, url))
        time.sleep(0.5)
        assert complete(config, url) == {".metadata", "__1_0.distcp"}
        assert sent(server, "__1_0.distcp", since) == (src / "__1_0.distcp").stat().st_size
        read(mp, "__3_0.distcp")   # its rank changed: read on demand, right bytes
        wait_for(lambda: "__3_0.distcp" in complete(config, url))   # and streamed whole
    assert complete(config, url) == {".metadata", "__1_0.distcp", "__3_0.distcp"}
    assert "__0_0.distcp" not in served(server)


def test_a_fresh_node_stages_the_profiled_part_of_a_shard_it_reads(need_fuse, checkpoint,
                                                                   tmp_path):
    """A node with no history of its own (a fresh node, or its ranks moved) and a recorded
    access profile: a shard its rank starts reading streams the part the profile says was
    read, not the whole file; a read past it still gets the right bytes, on demand."""
    from bootseer.ckpt.mount import mount_checkpoint
    src, server = checkpoint
    url = f"{server.url}/"
    stripe = 256 << 10
    config = BootseerConfig.from_env({}, overrides={
        "cache": {"dir": str(tmp_path / "node/cache")},
        "ckpt": {"stage": "reads", "stripe_bytes": stripe, "readahead_max_bytes": stripe}})
    want = (src / "__1_0.distcp").read_bytes()
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount_checkpoint(url, str(mp), config):   # records the profile: 1 MiB of __1 read
        wait_for(lambda: ".metadata" in complete(config, url))
        with open(mp / "__1_0.distcp", "rb") as f:
            assert f.read(MiB) == want[:MiB]
    staged_dir = staging.node_staging_dir(config)
    history_path(staged_dir, url).unlink()   # no load of this node's own to plan from
    staging.gc(staged_dir, 0)
    since = log_size(server)
    with mount_checkpoint(url, str(mp), config):
        wait_for(lambda: ".metadata" in complete(config, url))
        with open(mp / "__1_0.distcp", "rb") as f:
            assert f.read(MiB) == want[:MiB]
            time.sleep(1.0)   # what streams after the first read has had its time
            # the profile's part (the first MiB and the kernel's read-ahead), not 3 MiB
            assert sent(server, "__1_0.distcp", since) <= 2 * MiB + stripe
            f.seek(2 * MiB)
            assert f.read(MiB) == want[2 * MiB:3 * MiB]   # outside the profile: on demand


def test_stage_all_and_a_bad_setting(need_fuse, checkpoint, tmp_path):
    from bootseer.ckpt.mount import mount_checkpoint
    from bootseer.errors import ConfigError
    _, server = checkpoint
    url = f"{server.url}/"
    with pytest.raises(ConfigError, match="ckpt.stage: 'some' is not auto, reads or all"):
        BootseerConfig.from_env({"BOOTSEER_CKPT_STAGE": "some"})
    # auto on a one-node job (peers.nodes 1): every file, as before
    config = BootseerConfig.from_env({}, overrides={"cache": {"dir": str(tmp_path / "c")}})
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount_checkpoint(url, str(mp), config):
        wait_for(lambda: complete(config, url) == {".metadata", *SHARDS})


def test_a_shard_read_in_part_is_staged_in_part(checkpoint, tmp_path):
    """The history keeps the ranges read: a file the last load read whole is staged whole,
    one it read in part only that part (in stripes), the others not at all."""
    import json

    from bootseer.ckpt.engine import Engine
    from bootseer.ckpt.prefetch import start_plan
    from bootseer.ckpt.share import NodeReads
    from bootseer.config import CkptConfig, FetchConfig
    src, server = checkpoint
    url = f"{server.url}/"
    sources = RemoteDir(url).walk()
    stripe = 256 << 10
    engine = Engine(CkptConfig(stripe_bytes=stripe, memory_budget_bytes=4 << 20),
                    FetchConfig(retries=1, backoff_s=0.01, timeout_s=5, deadline_s=20),
                    staging=str(tmp_path / "staging"))
    size = sources["__1_0.distcp"].size
    path = history_path(engine.staging.dir, url)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"v": 1, "url": url, "files": {
        "__1_0.distcp": sources["__1_0.distcp"].key, "__2_0.distcp": sources["__2_0.distcp"].key,
        "__3_0.distcp": "another version"},
        "ranges": [["__1_0.distcp", 0, size], ["__2_0.distcp", 100, 300 << 10],
                   ["__2_0.distcp", 200 << 10, 400 << 10], ["__3_0.distcp", 0, 10]]}))
    try:
        prefetch, _ = start_plan(engine, RemoteDir(url), node_reads=NodeReads(
            engine.staging.dir, url))
        assert prefetch.join(30)
        got: dict[str, int] = {}
        for u, start, end in set(prefetch.issued):   # a stripe in flight is listed again
            name = u.rsplit("/", 1)[1]
            got[name] = got.get(name, 0) + end - start
        got.pop(".metadata", None)   # small: staged whole (here by the planner's own read)
        assert got == {"__1_0.distcp": size, "__2_0.distcp": 2 * stripe}, got
    finally:
        engine.close()


def dcp_types():
    """torch, its ``_StorageInfo`` and its DCP metadata module (skips without torch)."""
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint import metadata
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    return torch, _StorageInfo, metadata


def dcp_metadata(sharded: bool) -> bytes:
    """A DCP ``.metadata`` as torch writes it: a tensor stored in two parts (an FSDP save)
    or whole (a replicated model), and a bytes item."""
    import pickle

    torch, info, m = dcp_types()
    size = torch.Size([8, 4])
    parts = [m.ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([4, 4])),
             m.ChunkStorageMetadata(torch.Size([4, 0]), torch.Size([4, 4]))] if sharded else \
        [m.ChunkStorageMetadata(torch.Size([0, 0]), size)]
    storage = {m.MetadataIndex("w", c.offsets): info(f"__{i}_0.distcp", 0, 64)
               for i, c in enumerate(parts)}
    return pickle.dumps(m.Metadata(
        state_dict_metadata={"w": m.TensorStorageMetadata(m.TensorProperties(), size, parts),
                             "step": m.BytesStorageMetadata()},
        storage_data=storage))


@pytest.mark.torch
def test_auto_stages_the_reads_of_a_checkpoint_stored_in_parts_only(need_fuse, checkpoint,
                                                                     tmp_path):
    """``ckpt.stage`` auto on a job of two nodes: a DCP save whose tensors are stored in
    parts (each rank loads its own) is staged by what the node reads; one that stores
    every tensor whole (every rank loads it all) is staged whole."""
    from bootseer.ckpt.mount import mount_checkpoint
    from bootseer.ckpt.named_files import NotCheckpointMetadata, dcp_sharded
    src, server = checkpoint
    url = f"{server.url}/"
    assert dcp_sharded(dcp_metadata(True)) and not dcp_sharded(dcp_metadata(False))
    with pytest.raises(NotCheckpointMetadata):
        dcp_sharded(b"not a pickle")
    for stored_in_parts in (True, False):
        (src / ".metadata").write_bytes(dcp_metadata(stored_in_parts))
        config = BootseerConfig.from_env({}, overrides={
            "cache": {"dir": str(tmp_path / f"node-{stored_in_parts}/cache")},
            "peers": {"nodes": 2}})
        mp = tmp_path / f"mnt-{stored_in_parts}"
        mp.mkdir()
        with mount_checkpoint(url, str(mp), config):
            if stored_in_parts:
                wait_for(lambda: ".metadata" in complete(config, url))   # noqa: B023
                time.sleep(0.5)
                assert complete(config, url) == {".metadata"}
            else:
                wait_for(lambda: complete(config, url) == {".metadata", *SHARDS})  # noqa: B023
