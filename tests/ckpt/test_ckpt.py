"""Striped checkpoint reads against real nginx: the Python API over the node's staging
area, the FUSE mount with a real torch DCP checkpoint, single-stream mode, plan prefetch
and the faults."""

from __future__ import annotations

import os

import pytest

from bootseer.ckpt import api
from bootseer.ckpt.engine import Engine
from bootseer.ckpt.listing import RemoteDir
from bootseer.ckpt.prefetch import start_plan
from bootseer.ckpt.source import FileChanged
from bootseer.config import BootseerConfig, CkptConfig, FetchConfig

pytestmark = pytest.mark.timeout(60)
KiB = 1024
CKPT = CkptConfig(stripe_bytes=256 * KiB, memory_budget_bytes=4 * 1024 * KiB)


def make_engine(staging, **kw) -> Engine:
    return Engine(CkptConfig(**{"stripe_bytes": 256 * KiB,
                                "memory_budget_bytes": 4 * 1024 * KiB, **kw}),
                  FetchConfig(retries=1, backoff_s=0.01, timeout_s=5, deadline_s=20),
                  staging=str(staging))


@pytest.fixture
def served(tmp_path, nginx_factory):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "big.bin").write_bytes(os.urandom(5 * 1024 * 1024 + 333))
    (d / "sub").mkdir()
    (d / "sub/small.bin").write_bytes(b"tiny")
    (d / ".metadata").write_bytes(b"meta!")
    return d, nginx_factory(d)


def test_python_api_reads_seeks_and_stripes(served, tmp_path):
    d, server = served
    want = (d / "big.bin").read_bytes()
    with make_engine(tmp_path / "st") as e, api.open(f"{server.url}/big.bin", engine=e) as f:
        assert f.read(10) == want[:10]
        f.seek(3 * 1024 * 1024)
        assert f.read(1000) == want[3 * 1024 * 1024:][:1000]
        f.seek(0)
        assert f.read() == want
        assert e.statistics().requests >= 20  # many stripes, not one stream


def test_listing_finds_hidden_metadata_and_subdirs(served):
    d, server = served
    assert set(RemoteDir(f"{server.url}/").walk()) == {"big.bin", "sub/small.bin", ".metadata"}


def test_file_changed_during_read_fails_clearly(served, tmp_path):
    d, server = served
    with make_engine(tmp_path / "st") as e:
        f = e.file(RemoteDir(server.url).source("big.bin"))
        f.read(0, 100)
        (d / "big.bin").write_bytes(os.urandom(5 * 1024 * 1024 + 333))  # new version, same size
        st = os.stat(d / "big.bin")
        os.utime(d / "big.bin", (st.st_atime, st.st_mtime + 10))  # ETag = mtime + size
        with pytest.raises(FileChanged, match="changed|modified"):
            f.read(4 * 1024 * 1024, 100)


def test_prefetch_then_local_reads_and_budget(served, tmp_path):
    d, server = served
    with make_engine(tmp_path / "st", memory_budget_bytes=1 << 20) as e:
        prefetch, kind = start_plan(e, RemoteDir(f"{server.url}/"))
        assert prefetch.join(60) and kind == "files"
        fetched = e.statistics().bytes_fetched
        assert fetched >= 5 * 1024 * 1024
        big = e.file(RemoteDir(server.url).source("big.bin"))
        assert big.read(0, 10**8) == (d / "big.bin").read_bytes()
        assert e.statistics().bytes_fetched == fetched           # served from staging
        assert e.statistics().memory_peak_bytes <= (1 << 20) * 1.1
    with make_engine(tmp_path / "st") as again:  # another process: trusts .complete markers
        big = again.file(RemoteDir(server.url).source("big.bin"))
        assert big.read(0, 100) == (d / "big.bin").read_bytes()[:100]
        assert again.statistics().bytes_fetched == 0             # second load: local disk


def test_server_down_is_an_error(served, nginx_factory, tmp_path):
    from bootseer.errors import FetchError
    server = nginx_factory(served[0], own=True)   # killed below
    with make_engine(tmp_path / "st") as e:
        src = RemoteDir(server.url).source("big.bin")
        server.kill()
        with pytest.raises(FetchError):
            e.file(src).read(0, 100)


def test_wrong_url_is_a_clear_error(tmp_path, nginx_factory):
    from bootseer.errors import BlobNotFound
    server = nginx_factory(tmp_path)
    with pytest.raises(BlobNotFound, match="nope"):
        RemoteDir(f"{server.url}/nope/").check_root()


def test_fsspec_boundary_memory_filesystem(tmp_path):
    import fsspec
    fs = fsspec.filesystem("memory")
    fs.pipe("/ck/a.bin", b"x" * 700_000)
    with make_engine(tmp_path / "st") as e:
        assert e.file(RemoteDir("memory:///ck").source("a.bin")).read(600_000, 10) == b"x" * 10


@pytest.mark.torch
def test_dcp_checkpoint_through_the_mount(need_fuse, tmp_path, nginx_factory):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    src = tmp_path / "dcp"
    state = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(7)}
    dcp.save(state, checkpoint_id=str(src))
    server = nginx_factory(src)
    from bootseer.ckpt.mount import mount_checkpoint
    config = BootseerConfig.from_env(overrides={"cache": {"dir": str(tmp_path / "cache/blobs")},
                                                "fetch": {"part_bytes": 256 * 1024}})
    for mode in ("striped", "single"):
        mp = tmp_path / f"mnt-{mode}"
        mp.mkdir()
        with mount_checkpoint(f"{server.url}/", str(mp), config, mode=mode):
            out = {"w": torch.zeros(300_000), "b": torch.zeros(7)}
            dcp.load(out, checkpoint_id=str(mp))
            assert torch.equal(out["w"], state["w"]) and torch.equal(out["b"], state["b"])
        assert not os.path.ismount(mp)


@pytest.mark.root
def test_full_staging_disk_fails_the_read_instead_of_hanging(served, tmp_path):
    import subprocess as sp
    from bootseer.errors import CacheError
    d, server = served
    small = tmp_path / "tiny"
    small.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tiny tmpfs needs root")
    sp.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        with make_engine(small) as e:
            with pytest.raises(CacheError, match="cannot stage"):
                e.file(RemoteDir(server.url).source("big.bin")).read(0, 10**8)
    finally:
        sp.run(["umount", "-l", str(small)])
