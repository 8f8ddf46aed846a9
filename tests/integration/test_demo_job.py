"""The demo's job on two small nodes: real network namespaces on a bridge, real torchrun
(c10d rendezvous, gloo) started through ``bootseer run`` on the host (no image, to stay
fast), resuming FSDP2 from a DCP checkpoint saved by two ranks. Faults: a node that never
joins, a node killed during startup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer.demo import scenario as S
from bootseer.demo.assets import Assets
from bootseer.testing.netns import Network, processes_in

TINY = ["--dim", "32", "--layers", "1", "--vocab", "256"]
TRAIN = str(Assets(Path("/nonexistent")).train_script)
JOIN_TIMEOUT_S = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny model's checkpoint saved by two ranks (one shard file each)."""
    ckpt = tmp_path_factory.mktemp("ckpt") / "step"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", TRAIN, "--init", str(ckpt), *TINY],
                       capture_output=True, text=True, timeout=240,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in ckpt.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    return ckpt


@pytest.fixture
def cluster(need_root):
    with Network("bstest") as net:
        yield [net.add_host("node0"), net.add_host("node1")]


def _job(nodes) -> S.Job:
    return S.Job(nodes=nodes, python=sys.executable, script=TRAIN, script_args=TINY,
                 job_id="t", join_timeout_s=JOIN_TIMEOUT_S)


def _launch(job, tmp_path, checkpoint, name, **kw):
    start = S.Start(name, [], attempt=None)   # bootseer run --attempt auto counts starts
    env = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
           "BOOTSEER_TRACE_LOCATION": str(tmp_path / "trace"), "BOOTSEER_TRACE_JOB_ID": "t",
           "BOOTSEER_STORE_URL": str(tmp_path / "store"), "PYTHONPATH": os.environ.get(
               "PYTHONPATH", "")}
    return S.launch_nodes(start, job, work=tmp_path, base_env=env,
                          run_args=["--ckpt", str(checkpoint)], **kw)


def _no_process_left(nodes, grace_s: float = 10):
    """No process on any node, after a grace for orphans still exiting (multiprocessing's
    resource tracker leaves when the last holder of its pipe is gone)."""
    deadline = time.monotonic() + grace_s
    for host in nodes:
        while processes_in(host.netns) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {pid: _cmdline(pid) for pid in processes_in(host.netns)}
        assert left == {}, f"processes left on {host.name}"


def test_the_items_every_rank_reads_are_those_torch_stores_whole(checkpoint):
    """The items a node holds rather than stages (ckpt/share.py), read inert from the real
    FSDP2 save's ``.metadata``, are the ones torch's own metadata stores whole (bytes, and
    tensors in one chunk of their full size: the optimizer's step counters)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from bootseer.ckpt.named_files import dcp_shared_items
    meta = FileSystemReader(str(checkpoint)).read_metadata()
    want = []
    for index, info in meta.storage_data.items():
        md = meta.state_dict_metadata[index.fqn]
        if isinstance(md, BytesStorageMetadata) or (
                len(md.chunks) == 1 and md.chunks[0].sizes == md.size):
            want.append((info.relative_path, info.offset, info.length))
    got = dcp_shared_items((checkpoint / ".metadata").read_bytes())
    assert got == sorted(want) and any(".step" in k for k in meta.state_dict_metadata)
    assert 0 < len(got) < len(meta.storage_data)


def test_two_nodes_rendezvous_load_their_shards_and_step(cluster, checkpoint, tmp_path):
    job = _job(cluster)
    results = S.wait_nodes(_launch(job, tmp_path, checkpoint, "first"), timeout_s=120)
    for r in results:
        assert r.rc == 0, r.log.read_text()
        assert r.ready_s is not None
    logs = " ".join(r.log.read_text() for r in results)
    assert "rank 0/2 resumed" in logs and "rank 1/2 resumed" in logs
    assert S.explain_failure(results) is None
    waits = S.rendezvous_wait(results)
    assert set(waits) == {"node0", "node1"} and min(waits.values()) == 0.0
    _no_process_left(cluster)


def test_a_node_that_never_joins_times_out_the_others_naming_it(cluster, checkpoint, tmp_path):
    job = _job(cluster)
    t = time.monotonic()
    results = S.wait_nodes(_launch(job, tmp_path, checkpoint, "first", hold={"node1"}),
                           timeout_s=60)
    assert time.monotonic() - t < 45   # the rendezvous timeout, not the harness's deadline
    node0 = results[0]
    assert node0.rc not in (0, None) and node0.timed_out_at_rendezvous
    assert S.explain_failure(results) == "rendezvous timed out on node0: node1 never joined"
    _no_process_left(cluster)


def test_a_node_killed_during_startup_fails_the_job_and_the_next_attempt_counts(
        cluster, checkpoint, tmp_path):
    job = _job(cluster)
    launched = _launch(job, tmp_path, checkpoint, "first")
    deadline = time.monotonic() + 60
    while not any("torch.distributed.run" in _cmdline(pid)
                  for pid in processes_in(cluster[1].netns)):
        assert time.monotonic() < deadline, "node1 never started its command"
        time.sleep(0.1)
    launched[1].kill()   # mid-startup: torchrun joining, the trainer not yet ready
    results = S.wait_nodes(launched, timeout_s=60)
    assert results[1].rc == -9 and all(r.ready_s is None for r in results)
    assert results[0].rc not in (0, None)
    assert "node1 (killed by SIGKILL)" in S.explain_failure(results)   # joined or not
    _no_process_left(cluster)

    retry = S.wait_nodes(_launch(job, tmp_path, checkpoint, "retry"), timeout_s=120)
    assert [r.rc for r in retry] == [0, 0] and S.explain_failure(retry) is None
    attempts = {json.loads(line).get("attempt")
                for f in (tmp_path / "trace").rglob("*.jsonl") for line in f.open()}
    assert {0, 1} <= {int(a) for a in attempts if a is not None}
    _no_process_left(cluster)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
