"""Mirrors of a checkpoint on two real nginx servers: hedged reads around a slow replica,
failover around a dead one, and a mirror that is not a copy refused."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from bootseer.ckpt import api
from bootseer.ckpt.engine import Engine
from bootseer.ckpt.listing import RemoteDir
from bootseer.ckpt.replicas import ReplicaMismatch
from bootseer.config import BootseerConfig, CkptConfig, FetchConfig

pytestmark = pytest.mark.timeout(60)
KiB = 1024
SIZE = 4 * 1024 * KiB
STRIPE = 256 * KiB
SLOW_RATE = "32k"  # bytes/s per connection: one 256 KiB stripe takes about 6 s
# Replicas take turns being asked first: half the stripes go to the slow one first.
SLOW_FIRST = SIZE // STRIPE // 2


def make_engine(**kw) -> Engine:
    return Engine(CkptConfig(**{"stripe_bytes": STRIPE, "memory_budget_bytes": 4096 * KiB,
                                "max_stripes_in_flight": 8, "hedge_min_s": 0.05, **kw}),
                  FetchConfig(retries=1, backoff_s=0.05, timeout_s=10, deadline_s=30))


@pytest.fixture
def copies(tmp_path):
    """The same checkpoint in two directories (same bytes, same mtimes: rsync -a)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "model.bin").write_bytes(os.urandom(SIZE))
    (a / "small.bin").write_bytes(b"s" * 1000)
    shutil.copytree(a, b)  # copy2: times kept
    return a, b


def test_slow_replica_is_hedged_and_the_load_stays_fast(nginx_factory, copies):
    a, b = copies
    fast, slow = nginx_factory(a), nginx_factory(b, limit_rate=SLOW_RATE)
    want = (a / "model.bin").read_bytes()
    with make_engine() as e:
        remote = RemoteDir(slow.url, mirrors=[fast.url])  # the slow one is even the primary
        remote.check_root()
        f = e.file(remote.source("model.bin"))
        assert f.read(0, SIZE) == want
        s = e.statistics()
    # every stripe asked of the slow server first was asked of the fast one too (one hedge
    # each; a fast stripe hedged on a loaded machine only adds to the count), so the load
    # never waited for a slow stripe whole, however long each took here
    assert s.hedged_reads >= SLOW_FIRST, s


def test_a_hedged_reads_loser_hangs_up(nginx_factory, copies):
    """The slow replica's copy of a hedged stripe is abandoned once the fast one answered:
    nginx logs it as a partial 206 within a second or two, not a whole stripe ~8 s later."""
    a, b = copies
    fast, slow = nginx_factory(a), nginx_factory(b, limit_rate=SLOW_RATE, access_log=True)
    with make_engine() as e:
        remote = RemoteDir(slow.url, mirrors=[fast.url])
        remote.check_root()
        assert e.file(remote.source("model.bin")).read(0, SIZE) == (a / "model.bin").read_bytes()
        assert e.statistics().hedged_reads >= 1
    log = slow.workdir / "access.log"
    partial = []
    for _ in range(40):  # a whole stripe would take ~8 s at the slow rate
        time.sleep(0.1)
        # combined format: ... "GET /model.bin HTTP/1.1" 206 <body bytes sent> ...
        partial = [int(line.split('"')[2].split()[1]) for line in log.read_text().splitlines()
                   if "/model.bin" in line and '" 206 ' in line]
        partial = [n for n in partial if n < STRIPE]
        if partial:
            break
    assert partial, "the slow replica's request was not abandoned"


def test_python_api_with_mirrors_hedges(nginx_factory, copies):
    a, b = copies
    fast, slow = nginx_factory(a), nginx_factory(b, limit_rate=SLOW_RATE)
    with make_engine() as e, api.open(f"{slow.url}/model.bin", engine=e,
                                      mirrors=[f"{fast.url}/model.bin"]) as f:
        assert f.read() == (a / "model.bin").read_bytes()
        assert e.statistics().hedged_reads >= SLOW_FIRST


@pytest.mark.parametrize("dead", ["mirror", "primary"])
def test_a_dead_replica_does_not_fail_the_read(nginx_factory, copies, dead):
    a, b = copies
    primary, mirror = nginx_factory(a, own=True), nginx_factory(b, own=True)   # one killed
    want = (a / "model.bin").read_bytes()
    with make_engine() as e:
        remote = RemoteDir(primary.url, mirrors=[mirror.url])
        remote.check_root()
        src = remote.source("model.bin")
        (mirror if dead == "mirror" else primary).kill()
        assert e.file(src).read(0, SIZE) == want
        assert e.statistics().failovers >= 1


def test_mirror_that_is_not_a_copy_is_refused(nginx_factory, copies):
    a, b = copies
    (b / "model.bin").write_bytes(os.urandom(SIZE + 1))
    remote = RemoteDir(nginx_factory(a).url, mirrors=[nginx_factory(b).url])
    with pytest.raises(ReplicaMismatch, match=r"model.bin.*\d+ bytes.*refusing the mirror"):
        remote.check_root()
    with pytest.raises(ReplicaMismatch, match="refusing the mirror"):
        remote.source("model.bin")


def test_mirror_of_another_file_is_refused_by_the_api(nginx_factory, copies):
    a, b = copies
    os.utime(b / "model.bin", (1e9, 1e9))
    fast, other = nginx_factory(a), nginx_factory(b)
    with make_engine() as e, pytest.raises(ReplicaMismatch, match="rsync -a"):
        api.open(f"{fast.url}/model.bin", engine=e, mirrors=[f"{other.url}/model.bin"])


def test_mount_with_a_mirror_reads_through_a_dead_primary(need_fuse, nginx_factory, copies,
                                                          tmp_path):
    from bootseer.ckpt.mount import mount_checkpoint
    a, b = copies
    primary, mirror = nginx_factory(a, own=True), nginx_factory(b, own=True)   # one killed
    config = BootseerConfig.from_env(overrides={
        "cache": {"dir": str(tmp_path / "cache/blobs")},
        "ckpt": {"stripe_bytes": 256 * KiB, "memory_budget_bytes": 4096 * KiB},
        "fetch": {"retries": 1, "backoff_s": 0.05, "timeout_s": 10}})
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount_checkpoint(primary.url, str(mp), config, prefetch=False,
                          mirrors=(mirror.url,)):
        primary.kill()
        assert (mp / "model.bin").read_bytes() == (a / "model.bin").read_bytes()
    assert not os.path.ismount(mp)
    (b / "small.bin").write_bytes(b"different size")
    with pytest.raises(ReplicaMismatch, match="small.bin"):
        mount_checkpoint(mirror.url, str(mp), config, mirrors=(nginx_factory(a).url,))
    assert not os.path.ismount(mp)


def test_load_report_is_a_traced_phase(need_fuse, nginx_factory, copies, tmp_path, monkeypatch):
    """With a trace configured, a load through the mount ends in a ``ckpt.load`` phase
    carrying the report: first byte, throughput, fetched vs consumed, stalls, hedges."""
    from bootseer.ckpt.mount import mount_checkpoint
    from bootseer.report import load as trace_load
    a, b = copies
    fast, slow = nginx_factory(a), nginx_factory(b, limit_rate=SLOW_RATE)
    for k, v in {"LOCATION": str(tmp_path / "trace"), "JOB_ID": "j", "ATTEMPT": "0",
                 "NODE": "n0"}.items():
        monkeypatch.setenv(f"BOOTSEER_TRACE_{k}", v)
    monkeypatch.setenv("BOOTSEER_CKPT_STRIPE_BYTES", str(256 * KiB))
    monkeypatch.setenv("BOOTSEER_CKPT_HEDGE_MIN_S", "0.05")
    config = BootseerConfig.from_env(overrides={"cache": {"dir": str(tmp_path / "c/blobs")}})
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount_checkpoint(slow.url, str(mp), config, prefetch=False, mirrors=(fast.url,)):
        assert (mp / "model.bin").read_bytes() == (a / "model.bin").read_bytes()
    events = [e for e in trace_load.load(tmp_path / "trace").events
              if e.get("phase") == "ckpt.load"]
    assert len(events) == 1, events
    attrs = events[0]["attrs"]
    assert attrs["via"] == "mount" and attrs["bytes_consumed"] >= SIZE
    assert attrs["bytes_fetched"] >= SIZE and attrs["first_byte_s"] is not None
    assert attrs["hedged_reads"] >= 1 and "stall_s" in attrs
