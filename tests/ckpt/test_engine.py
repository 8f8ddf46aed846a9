"""The striped engine and bootseer.ckpt.open against a real nginx: correctness of every
access pattern, one memory budget, and each fault of the issue."""

from __future__ import annotations

import io
import os
import random
import threading

import pytest

from bootseer.ckpt import api
from bootseer.ckpt.budget import BudgetError, MemoryBudget
from bootseer.ckpt.engine import Engine
from bootseer.ckpt.listing import PathOutsideRoot, RemoteDir
from bootseer.ckpt.prefetch import Prefetch, Span
from bootseer.ckpt.source import FileChanged, HttpFileSource, open_source
from bootseer.ckpt.view import RemoteDirView
from bootseer.config import CkptConfig, FetchConfig
from bootseer.errors import FetchError

pytestmark = pytest.mark.timeout(60)
KiB = 1024


def wait_budget_idle(e: Engine, timeout_s: float = 10) -> None:
    """Read-ahead still in flight gives its budget back when it lands."""
    import time
    deadline = time.monotonic() + timeout_s
    while e.budget.used and time.monotonic() < deadline:
        time.sleep(0.01)


def engine(**kw) -> Engine:
    cfg = {"stripe_bytes": 64 * KiB, "memory_budget_bytes": 1024 * KiB,
           "max_stripes_in_flight": 8, "per_host": 4, "readahead_max_bytes": 512 * KiB}
    cfg.update(kw)
    return Engine(CkptConfig(**cfg), FetchConfig(retries=2, backoff_s=0.05, timeout_s=5,
                                                 deadline_s=20))


@pytest.fixture
def data(www) -> bytes:
    blob = random.Random(1).randbytes(1_000_003)
    (www / "model.bin").write_bytes(blob)
    return blob


def test_sequential_random_and_concurrent_reads_match(nginx, data):
    e = engine()
    try:
        f = api.open(f"{nginx.url}/model.bin", engine=e)
        assert f.size == len(data) and f.seekable() and f.readable()
        got = bytearray()
        while chunk := f.read(100_000):  # sequential: read-ahead grows
            got += chunk
        assert bytes(got) == data
        rng = random.Random(2)
        for _ in range(50):  # random: exact ranges
            off = rng.randrange(len(data))
            n = rng.randrange(1, 5000)
            f.seek(off)
            assert f.read(n) == data[off:off + n] and f.tell() == min(len(data), off + n)
        buf = bytearray(1234)
        f.seek(-1234, io.SEEK_END)
        assert f.readinto(buf) == 1234 and bytes(buf) == data[-1234:]

        errors = []

        def cursor(start):  # several cursors on one file
            try:
                g = api.open(f"{nginx.url}/model.bin", engine=e)
                g.seek(start)
                assert g.read(300_000) == data[start:start + 300_000]
                g.close()
            except BaseException as ex:  # noqa: BLE001
                errors.append(ex)
        ts = [threading.Thread(target=cursor, args=(s,)) for s in (0, 250_000, 600_000)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors
        f.close()
        wait_budget_idle(e)
        assert e.budget.peak <= e.budget.total and e.budget.used == 0
        assert e.statistics().bytes_fetched >= len(data)
    finally:
        e.close()


def test_random_reads_fetch_exact_ranges(nginx, data):
    e = engine()
    try:
        f = api.open(f"{nginx.url}/model.bin", engine=e)
        for off in (900_000, 10_000, 500_000):
            f.seek(off)
            assert f.read(100) == data[off:off + 100]
        assert e.statistics().bytes_fetched == 300  # no stripes, no read-ahead
        f.close()
    finally:
        e.close()


def test_budget_is_shared_and_bounded(nginx, www):
    blobs = {f"f{i}.bin": os.urandom(700_000) for i in range(4)}
    for n, b in blobs.items():
        (www / n).write_bytes(b)
    e = engine(memory_budget_bytes=256 * KiB)
    try:
        files = {n: api.open(f"{nginx.url}/{n}", engine=e) for n in blobs}
        out = {n: bytearray() for n in blobs}
        for _ in range(12):  # interleave four sequential streams
            for n, f in files.items():
                out[n] += f.read(64 * KiB)
        for n, f in files.items():
            out[n] += f.read()
            f.close()
        assert all(bytes(out[n]) == blobs[n] for n in blobs)
        assert e.budget.peak <= 256 * KiB
    finally:
        e.close()


def test_budget_smaller_than_one_stripe_is_a_clear_error():
    with pytest.raises(BudgetError, match="smaller than one stripe"):
        MemoryBudget(1000, 8 * 1024 * 1024)
    with pytest.raises(BudgetError, match="ckpt.memory_budget_bytes"):
        engine(memory_budget_bytes=32 * KiB)


@pytest.mark.torch
def test_torch_load_through_open(nginx, www):
    torch = pytest.importorskip("torch")
    sd = {"w": torch.randn(300, 200), "b": torch.arange(1000)}
    torch.save(sd, www / "ckpt.pt")
    e = engine()
    try:
        with api.open(f"{nginx.url}/ckpt.pt", engine=e) as f:
            got = torch.load(f, weights_only=True)
        assert torch.equal(got["w"], sd["w"]) and torch.equal(got["b"], sd["b"])
    finally:
        e.close()


def test_local_and_file_urls(tmp_path, data):
    (tmp_path / "x.bin").write_bytes(data)
    e = engine()
    try:
        for url in (str(tmp_path / "x.bin"), f"file://{tmp_path}/x.bin"):
            with api.open(url, engine=e) as f:
                assert f.read() == data
    finally:
        e.close()


def test_file_replaced_during_read_fails_clearly(nginx, www, data):
    e = engine(readahead_max_bytes=64 * KiB)
    try:
        f = api.open(f"{nginx.url}/model.bin", engine=e)
        f.read(100)
        tmp = www / "model.bin.new"
        tmp.write_bytes(os.urandom(len(data) + 10))
        os.utime(tmp, (1e9, 1e9))
        os.replace(tmp, www / "model.bin")
        with pytest.raises(FileChanged, match="model.bin") as ex:
            f.seek(800_000)
            f.read(1000)
        assert ex.value.url.endswith("/model.bin") and ex.value.offset == 800_000
    finally:
        e.close()


def test_truncated_file_fails_clearly(nginx, www, data):
    src = open_source(f"{nginx.url}/model.bin")
    with open(www / "model.bin", "r+b") as f:
        f.truncate(500_000)
    os.utime(www / "model.bin", (src.mtime, src.mtime))  # same mtime: only the size tells
    with pytest.raises(FileChanged, match="truncated|replaced|shorter"):
        src.read_range(400_000, 600_000)
    with pytest.raises(FileChanged):
        src.read_range(700_000, 800_000)


def test_404_after_listing(nginx, www, data):
    e = engine()
    try:
        view = RemoteDirView(RemoteDir(nginx.url), e)
        assert view.getattr("/model.bin").size == len(data)
        (www / "model.bin").unlink()
        with pytest.raises(FileChanged, match="404"):
            view.read("/model.bin", 100, 0)
    finally:
        e.close()


@pytest.mark.timeout(60)
def test_server_killed_mid_load_retries_then_fails_with_url_and_offset(nginx_factory, www, data):
    nginx = nginx_factory(www, own=True)   # killed below
    e = engine(readahead_max_bytes=64 * KiB)
    try:
        f = api.open(f"{nginx.url}/model.bin", engine=e)
        f.read(1000)
        nginx.kill()
        f.seek(700_000)
        with pytest.raises(FetchError) as ex:
            f.read(1000)
        assert "model.bin" in str(ex.value) and ex.value.offset == 700_000
        assert e.statistics().retries >= 1
    finally:
        e.close()


def test_path_outside_root(nginx, www, data):
    e = engine()
    try:
        view = RemoteDirView(RemoteDir(nginx.url + "/"), e)
        for bad in ("/../etc/passwd", "/a/../../x", "/.."):
            with pytest.raises(PathOutsideRoot):
                view.getattr(bad)
    finally:
        e.close()


def test_source_identity(nginx, data):
    s = HttpFileSource.stat(f"{nginx.url}/model.bin")
    assert s.size == len(data) and s.etag and s.mtime
    assert s.read_range(5, 10) == data[5:10]


def test_plan_prefetch_under_a_small_budget_never_deadlocks(nginx, data):
    e = engine(memory_budget_bytes=192 * KiB)  # three stripes
    try:
        f = api.open(f"{nginx.url}/model.bin", engine=e)
        plan = Prefetch(e, [Span(f.reader.source, 0, len(data))])  # waits for room
        f.seek(900_000)  # demand elsewhere goes first
        assert f.read(50_000) == data[900_000:950_000]
        f.seek(0)
        assert f.read() == data
        assert plan.join(30) and plan.failed == 0
        f.close()
        assert e.budget.peak <= 192 * KiB
        assert e.statistics().bytes_fetched < 2 * len(data)  # the plan and the reads share
    finally:
        e.close()


def test_staged_stripes_serve_a_second_open_without_refetching(nginx, data):
    e = engine()
    try:
        with api.open(f"{nginx.url}/model.bin", engine=e) as f:
            assert f.read() == data
        fetched = e.statistics().bytes_fetched
        with api.open(f"{nginx.url}/model.bin", engine=e) as f:
            f.seek(123_456)
            assert f.read(10_000) == data[123_456:133_456]  # staged: a local read
        assert e.statistics().bytes_fetched == fetched
    finally:
        e.close()
