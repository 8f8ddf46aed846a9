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
        "cache": {"dir": str(tmp_path / "node/cache")}, "ckpt": {"stage": "reads"}})

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
    with mount_checkpoint(url, str(mp), config):   # the next start: staged before any read
        wait_for(lambda: "__1_0.distcp" in complete(config, url))
        time.sleep(0.3)
        assert complete(config, url) == {".metadata", "__1_0.distcp"}
        read(mp, "__2_0.distcp")   # its rank changed: read on demand, right bytes
        wait_for(lambda: "__2_0.distcp" in complete(config, url))   # and streamed whole
    assert complete(config, url) == {".metadata", "__1_0.distcp", "__2_0.distcp"}
    assert "__0_0.distcp" not in served(server) and "__3_0.distcp" not in served(server)


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
