"""Striped checkpoint reads against real nginx: the Python API, the FUSE mount with a real
torch DCP checkpoint, single-stream mode, prefetch, and the faults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bootseer.config import BootseerConfig, FetchConfig
from bootseer.ckpt import engine as E
from bootseer.ckpt.remote import FileChanged

pytestmark = pytest.mark.timeout(180)
STRIPE = FetchConfig(part_bytes=256 * 1024)


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
    with E.open(f"{server.url}/big.bin", staging=str(tmp_path / "st"), fetch=STRIPE) as f:
        assert f.read(10) == want[:10]
        f.seek(3 * 1024 * 1024)
        assert f.read(1000) == want[3 * 1024 * 1024:][:1000]
        f.seek(0)
        assert f.read() == want
        raw = f.raw
        assert raw.engine.stats()["requests"] >= 20  # many stripes, not one stream


def test_listing_finds_hidden_metadata_and_subdirs(served):
    from bootseer.ckpt.remote import list_files
    d, server = served
    files = list_files(f"{server.url}/")
    assert set(files) == {"/big.bin", "/sub/small.bin", "/.metadata"}


def test_file_changed_during_read_fails_clearly(served, tmp_path):
    d, server = served
    e = E.Engine(f"{server.url}/", fetch=STRIPE, staging=tmp_path / "st")
    f = e.file("/big.bin")
    f.pread(100, 0)
    (d / "big.bin").write_bytes(os.urandom(5 * 1024 * 1024 + 333))  # new version, same size
    st = os.stat(d / "big.bin")
    os.utime(d / "big.bin", (st.st_atime, st.st_mtime + 10))  # ETag = mtime + size
    with pytest.raises(FileChanged, match="changed while"):
        f.pread(100, 4 * 1024 * 1024)
    e.close()


def test_prefetch_then_local_reads_and_budget(served, tmp_path):
    d, server = served
    e = E.Engine(f"{server.url}/", fetch=STRIPE, staging=tmp_path / "st", memory_budget=1 << 20)
    e.prefetch().join(60)
    fetched = e.stats()["bytes_fetched"]
    assert fetched >= 5 * 1024 * 1024
    assert e.file("/big.bin").pread(10**8, 0) == (d / "big.bin").read_bytes()
    assert e.stats()["bytes_fetched"] == fetched           # served from staging
    assert e.stats()["peak_inflight_bytes"] <= (1 << 20) * 1.1
    e.close()
    again = E.Engine(f"{server.url}/", fetch=STRIPE, staging=tmp_path / "st")
    assert again.file("/big.bin").pread(100, 0) == (d / "big.bin").read_bytes()[:100]
    assert again.stats()["bytes_fetched"] == 0             # second load: local disk
    again.close()


def test_server_down_is_an_error(served, tmp_path):
    from bootseer.errors import FetchError
    d, server = served
    e = E.Engine(f"{server.url}/", fetch=FetchConfig(part_bytes=256 * 1024, retries=1,
                                                       backoff_s=0.01), staging=tmp_path / "st")
    server.kill()
    with pytest.raises(FetchError):
        e.file("/big.bin").pread(100, 0)
    e.close()


def test_wrong_url_is_a_clear_error(tmp_path, nginx_factory):
    from bootseer.errors import BlobNotFound
    server = nginx_factory(tmp_path)
    with pytest.raises(BlobNotFound):
        E.Engine(f"{server.url}/nope/", staging=tmp_path / "st")


def test_fsspec_boundary_memory_filesystem(tmp_path):
    import fsspec
    fs = fsspec.filesystem("memory")
    fs.pipe("/ck/a.bin", b"x" * 700_000)
    e = E.Engine("memory:///ck", fetch=STRIPE, staging=tmp_path / "st")
    assert e.file("/a.bin").pread(10, 600_000) == b"x" * 10
    e.close()


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
        e = E.Engine(f"{server.url}/", fetch=STRIPE, staging=small)
        with pytest.raises(CacheError, match="cannot stage"):
            e.file("/big.bin").pread(10**8, 0)
        e.close()
    finally:
        sp.run(["umount", "-l", str(small)])
