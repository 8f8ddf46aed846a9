"""Access profiles end to end over real nginx: a load through the FUSE mount (or the DCP
reader) records the ranges it read; the next ``ckpt prefetch`` streams exactly those first,
and falls back to the metadata once a file changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from bootseer.ckpt import profile
from bootseer.ckpt.engine import Engine
from bootseer.ckpt.listing import RemoteDir
from bootseer.ckpt.prefetch import start_plan
from bootseer.ckpt.staging import node_staging_dir
from bootseer.config import BootseerConfig, CkptConfig

pytestmark = pytest.mark.timeout(90)
KiB = 1024
STRIPE = 256 * KiB


def stripes_of(url: str, ranges) -> list[tuple[str, int, int]]:
    """The stripes covering ``ranges`` in order, each once (what a prefetch issues)."""
    out: list[tuple[str, int, int]] = []
    for rel, start, end, size in ranges:
        for i in range(start // STRIPE, (end - 1) // STRIPE + 1):
            s = (f"{url}/{rel}", i * STRIPE, min(size, (i + 1) * STRIPE))
            if s not in out:
                out.append(s)
    return out


def cli_prefetch(url: str, env: dict) -> tuple[dict, str]:
    r = subprocess.run([sys.executable, "-m", "bootseer", "ckpt", "prefetch", url],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_mount_load_records_a_profile_that_the_next_prefetch_follows(
        need_fuse, nginx_factory, tmp_path):
    from bootseer.ckpt.mount import mount_checkpoint
    d = tmp_path / "ckpt"
    d.mkdir()
    blobs = {n: os.urandom(s) for n, s in (("a.bin", 2048 * KiB), ("b.bin", 2048 * KiB),
                                           ("c.bin", 1024 * KiB))}
    for n, b in blobs.items():
        (d / n).write_bytes(b)
    server = nginx_factory(d)
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache/blobs"),
           "BOOTSEER_CKPT_STRIPE_BYTES": str(STRIPE)}
    config = BootseerConfig.from_env(env)
    staging = node_staging_dir(config)
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount_checkpoint(server.url, str(mp), config, prefetch=False):
        # the load reads a subset: the middle of b.bin, then the head of a.bin
        fd = os.open(mp / "b.bin", os.O_RDONLY)
        assert os.pread(fd, 300 * KiB, 1024 * KiB) == blobs["b.bin"][1024 * KiB:1324 * KiB]
        os.close(fd)
        fd = os.open(mp / "a.bin", os.O_RDONLY)
        assert os.pread(fd, 100 * KiB, 0) == blobs["a.bin"][:100 * KiB]
        os.close(fd)
    saved = json.loads(profile.profile_path(staging, server.url).read_text())
    assert [r[0] for r in saved["ranges"]] == ["b.bin", "a.bin"]  # in the order read
    assert set(saved["files"]) == {"a.bin", "b.bin"}
    b_read = saved["ranges"][0]
    assert b_read[1] <= 1024 * KiB and b_read[2] >= 1324 * KiB  # the kernel may read ahead

    # a fresh node would have no staged bytes: drop them, keep the profile
    for p in staging.iterdir():
        if p.is_file():
            p.unlink()
    out, said = cli_prefetch(server.url, env)
    assert out["plan"] == "profile" and "recorded at the previous load" in said
    assert out["failed"] == 0

    for p in staging.iterdir():  # again, to see the order the plan issues stripes in
        if p.is_file():
            p.unlink()
    sizes = {n: len(b) for n, b in blobs.items()}
    with Engine(CkptConfig(stripe_bytes=STRIPE), staging=str(staging)) as e:
        prefetch, kind = start_plan(e, RemoteDir(server.url))
        assert kind == "profile" and prefetch.join(30)
    first = stripes_of(server.url, [(r, a, b, sizes[r]) for r, a, b in saved["ranges"]])
    assert prefetch.issued[:len(first)] == first  # exactly the subset, first, in order
    rest = {u for u, _, _ in prefetch.issued[len(first):]}
    assert f"{server.url}/c.bin" in rest  # then the rest: the staging copy ends complete

    os.utime(d / "b.bin", (1e9, 1e9))  # a new version of b.bin: the profile is stale
    out, said = cli_prefetch(server.url, env)
    assert out["plan"] == "files" and "file list" in said


@pytest.mark.torch
def test_dcp_reader_load_records_a_profile(nginx_factory, tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    from bootseer.ckpt.dcp import StripedDCPReader
    d = tmp_path / "dcp"
    state = {"w": torch.randn(64, 1024), "b": torch.arange(5000)}
    dcp.save(state, checkpoint_id=str(d))
    server = nginx_factory(d)
    cfg = CkptConfig(stripe_bytes=STRIPE, memory_budget_bytes=2048 * KiB)
    staging = tmp_path / "staging"
    with Engine(cfg, staging=str(staging)) as e:
        out = {"w": torch.zeros(64, 1024)}  # only part of the checkpoint
        dcp.load(out, storage_reader=StripedDCPReader(server.url, e))
        assert torch.equal(out["w"], state["w"])
    saved = json.loads(profile.profile_path(staging, server.url).read_text())
    assert any(r[0].endswith(".distcp") for r in saved["ranges"])
    with Engine(cfg, staging=str(staging)) as e:
        prefetch, kind = start_plan(e, RemoteDir(server.url))
        assert kind == "profile" and prefetch.join(30)
    shutil.rmtree(staging / "profiles-v1")
    with Engine(cfg, staging=str(staging)) as e:
        prefetch, kind = start_plan(e, RemoteDir(server.url))
        assert kind == "dcp" and prefetch.join(30)  # no profile: the metadata plan
        # the planner read .metadata through the engine: not a reader's load (no report,
        # no profile entry; a load through a mount would otherwise start at planning)
        s = e.statistics()
        assert s.bytes_consumed == 0 and s.first_byte_s is None


def test_profile_pushed_to_the_store_serves_a_fresh_node(need_fuse, nginx_factory, tmp_path):
    """A resume on fresh nodes (empty staging) plans from the profile another node pushed
    to the shared store; a corrupt profile blob falls back to the metadata."""
    from bootseer.ckpt.mount import mount_checkpoint
    from bootseer.store import open_store
    d = tmp_path / "ckpt"
    d.mkdir()
    blob = os.urandom(2048 * KiB)
    (d / "a.bin").write_bytes(blob)
    (d / "b.bin").write_bytes(os.urandom(1024 * KiB))
    server = nginx_factory(d)
    store = str(tmp_path / "store")

    def node(name: str) -> dict:
        return {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / name / "cache/blobs"),
                "BOOTSEER_CKPT_STRIPE_BYTES": str(STRIPE), "BOOTSEER_STORE_URL": store}
    config = BootseerConfig.from_env(node("n1"))
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount_checkpoint(server.url, str(mp), config, prefetch=False):
        fd = os.open(mp / "a.bin", os.O_RDONLY)
        assert os.pread(fd, 100 * KiB, 512 * KiB) == blob[512 * KiB:612 * KiB]
        os.close(fd)
    digest = open_store(store).get_ref(profile.store_ref(server.url))
    assert digest is not None
    out, said = cli_prefetch(server.url, node("n2"))     # another node, nothing local
    assert out["plan"] == "profile" and out["failed"] == 0
    p = open_store(store).path(digest)                   # bit rot in the store
    os.chmod(p, 0o644)
    p.write_bytes(p.read_bytes().replace(b'"a.bin"', b'"x.bin"', 1))
    out, said = cli_prefetch(server.url, node("n3"))
    assert out["plan"] == "files" and out["failed"] == 0   # verified, refused, not used


def test_a_stale_local_profile_gives_way_to_the_stores_newer_one(tmp_path):
    """This node recorded the previous checkpoint version; another node loaded the new one
    and pushed its profile: the store's is used, not the metadata plan."""
    from types import SimpleNamespace
    url, store = "http://ckpt.example/run", str(tmp_path / "store")
    os.makedirs(store)

    def recorded(staging, key, push):
        rec = profile.AccessRecorder()
        rec.add(f"{url}/a.bin", key, 0, 4096)
        profile.save(staging, url, rec, store_url=store if push else None)
    recorded(tmp_path / "n1", "a|1|old", push=False)       # this node, old version
    recorded(tmp_path / "n2", "a|2|new", push=True)        # another node, new version
    now = {"a.bin": SimpleNamespace(key="a|2|new")}
    ranges, why = profile.load(tmp_path / "n1", url, now, store_url=store)
    assert ranges == [("a.bin", 0, 4096)] and why == "recorded access profile"
    ranges, why = profile.load(tmp_path / "n1", url, now)   # no store: the local one is stale
    assert ranges == [] and "another version of a.bin" in why
