"""The remote-directory view on a real FUSE mount (torch.load, DCP, faults as errno) and the
DCP StorageReader over nginx: tensors identical to a local load."""

from __future__ import annotations

import errno
import functools
import os

import pytest

from bootseer.ckpt.dcp import StripedDCPReader
from bootseer.ckpt.engine import Engine
from bootseer.ckpt.listing import RemoteDir
from bootseer.ckpt.view import RemoteDirView
from bootseer.config import BootseerConfig, CkptConfig, FetchConfig
from bootseer.mount.fuse import MountError, mount

pytestmark = pytest.mark.timeout(120)
KiB = 1024
SMALL = dict(stripe_bytes=128 * KiB, memory_budget_bytes=2048 * KiB, readahead_max_bytes=1024 * KiB)
FAST_FAIL = dict(retries=2, backoff_s=0.05, timeout_s=5, deadline_s=20)


def _build(url, mode, ckpt):
    return RemoteDirView(RemoteDir(url),
                         Engine(CkptConfig(**{**SMALL, **ckpt}), FetchConfig(**FAST_FAIL)),
                         mode=mode)


def factory(url, mode="striped", **ckpt):
    """Pickles into the spawned FUSE server."""
    return functools.partial(_build, url, mode, ckpt)


@pytest.fixture
def dcp_dir(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    d = tmp_path / "dcp"
    state = {"w": torch.randn(256, 1024), "b": torch.arange(5000), "n": {"x": torch.ones(3)}}
    dcp.save(state, checkpoint_id=str(d))
    return d, state


def empty_like(state):
    import torch
    return {k: empty_like(v) if isinstance(v, dict) else torch.zeros_like(v)
            for k, v in state.items()}


def same(a, b):
    import torch
    return all(same(a[k], b[k]) if isinstance(a[k], dict) else torch.equal(a[k], b[k])
               for k in a)


def test_dcp_reader_over_nginx_matches_local_load(nginx_factory, dcp_dir):
    import torch.distributed.checkpoint as dcp
    d, state = dcp_dir
    server = nginx_factory(d)
    engine = Engine(CkptConfig(**SMALL))
    try:
        out = empty_like(state)
        dcp.load(out, storage_reader=StripedDCPReader(server.url, engine))
        local = empty_like(state)
        dcp.load(local, checkpoint_id=str(d))
        assert same(out, state) and same(out, local)
        assert engine.budget.peak <= engine.budget.total
    finally:
        engine.close()


@pytest.mark.parametrize("mode", ["striped", "single"])
def test_dcp_and_torch_load_through_the_mount(need_fuse, nginx_factory, dcp_dir, tmp_path, mode):
    import torch
    import torch.distributed.checkpoint as dcp
    d, state = dcp_dir
    torch.save({"w": state["w"]}, d / "plain.pt")
    server = nginx_factory(d)
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount(factory(server.url, mode), str(mp), name="ckpt"):
        out = empty_like(state)
        dcp.load(out, checkpoint_id=str(mp))
        assert same(out, state)
        assert torch.equal(torch.load(mp / "plain.pt", weights_only=True)["w"], state["w"])
        assert torch.equal(torch.load(mp / "plain.pt", weights_only=True, mmap=True)["w"],
                           state["w"])
        assert (mp / ".metadata").read_bytes() == (d / ".metadata").read_bytes()
    assert not os.path.ismount(mp)


def test_mount_faults_become_errno(need_fuse, nginx_factory, www, tmp_path):
    (www / "a.bin").write_bytes(os.urandom(600 * KiB))
    (www / "gone.bin").write_bytes(b"x" * 1000)
    (www / "short.bin").write_bytes(b"y" * 300 * KiB)
    server = nginx_factory(www, own=True)   # killed below
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount(factory(server.url), str(mp)):
        assert sorted(os.listdir(mp)) == ["a.bin", "gone.bin", "short.bin"]
        os.unlink(www / "gone.bin")  # 404 after listing
        with pytest.raises(OSError) as e:
            (mp / "gone.bin").read_bytes()
        assert e.value.errno == errno.EIO
        with open(www / "short.bin", "r+b") as f:  # truncated after listing
            f.truncate(100 * KiB)
        with pytest.raises(OSError) as e:
            (mp / "short.bin").read_bytes()
        assert e.value.errno == errno.EIO
        with pytest.raises(FileNotFoundError):
            os.stat(mp / "nope")
        fd = os.open(mp / "a.bin", os.O_RDONLY)
        try:
            assert len(os.pread(fd, 4096, 0)) == 4096
            server.kill()  # server killed mid-load: retries, then EIO, no hang
            with pytest.raises(OSError) as e:
                os.pread(fd, 4096, 500 * KiB)
            assert e.value.errno == errno.EIO
        finally:
            os.close(fd)
    assert not os.path.ismount(mp)


def test_budget_smaller_than_a_stripe_fails_at_mount(need_fuse, nginx, tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    with pytest.raises(MountError, match="smaller than one stripe"):
        mount(factory(nginx.url, memory_budget_bytes=64 * KiB), str(mp))
    assert not os.path.ismount(mp)


def test_missing_root_fails_at_mount(need_fuse, nginx, tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    with pytest.raises(MountError, match="404"):
        mount(factory(nginx.url + "/no/such/dir"), str(mp))


@pytest.mark.timeout(180)
def test_thousand_small_files(need_fuse, nginx_factory, www, tmp_path):
    for i in range(1000):
        (www / f"s{i:04d}.bin").write_bytes(i.to_bytes(4, "big") * 64)
    server = nginx_factory(www)
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount(factory(server.url), str(mp)):
        names = sorted(os.listdir(mp))  # one listing request for the directory
        assert len(names) == 1000
        for i, n in enumerate(names):  # one range GET per file: no HEAD, no per-file stall
            assert (mp / n).read_bytes() == i.to_bytes(4, "big") * 64


def test_config_section_from_env():
    cfg = BootseerConfig.from_env({"BOOTSEER_CKPT_STRIPE_BYTES": "4MiB"})
    assert cfg.ckpt.stripe_bytes == 4 * 1024 * 1024


def _build_reporting(url, report):
    return RemoteDirView(RemoteDir(url), Engine(CkptConfig(**SMALL)), stats_path=report)


def test_mount_writes_a_load_report(need_fuse, nginx, www, tmp_path):
    import json
    data = os.urandom(1500 * KiB)
    (www / "m.bin").write_bytes(data)
    mp = tmp_path / "mnt"
    mp.mkdir()
    report = tmp_path / "stats.json"
    with mount(functools.partial(_build_reporting, nginx.url, str(report)), str(mp)):
        assert (mp / "m.bin").read_bytes() == data
    s = json.loads(report.read_text())
    assert s["bytes_consumed"] >= len(data) and s["bytes_fetched"] >= len(data)
    assert s["first_byte_s"] is not None and s["memory_peak_bytes"] <= s["memory_budget_bytes"]


def test_benchmark_view_factory_reads_both_modes(nginx, www, tmp_path):
    """bench/ckpt/run.py builds its mounts with remote_view: the same engine, both modes."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location(
        "bench_ckpt", os.path.join(os.path.dirname(__file__), "../../bench/ckpt/run.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    data = os.urandom(700 * KiB)
    (www / "m.bin").write_bytes(data)
    cfg = BootseerConfig.from_env(overrides={"ckpt": SMALL})
    for mode in ("single", "striped"):
        report = tmp_path / f"{mode}.json"
        view = bench.remote_view(nginx.url, cfg, mode, str(report), str(tmp_path / mode))
        assert view.read("/m.bin", len(data), 0) == data
        view.close()
        assert json.loads(report.read_text())["bytes_consumed"] == len(data)
