"""The job's node count and id, derived from what the launcher already set, so that
``bootseer run`` turns peers on for a multi-node start by itself."""

from __future__ import annotations

import pytest

from bootseer.config import BootseerConfig
from bootseer.peers.job import job_id, job_nodes, with_job

TRAIN = ["train.py", "--lr", "1e-4"]


@pytest.mark.parametrize("argv, env, expected", [
    (["torchrun", "--nnodes", "4", "--nproc-per-node", "8", *TRAIN], {}, (4, "torchrun --nnodes")),
    (["/usr/bin/torchrun", "--nnodes=3", *TRAIN], {}, (3, "torchrun --nnodes")),
    (["torchrun", "--nnodes", "2:8", *TRAIN], {}, (8, "torchrun --nnodes")),   # elastic: most
    (["python3", "-m", "torch.distributed.run", "--nnodes", "5", *TRAIN], {},
     (5, "torchrun --nnodes")),
    (["python3", *TRAIN], {"SLURM_NNODES": "16"}, (16, "SLURM_NNODES")),
    (["python3", *TRAIN], {"SLURM_JOB_NUM_NODES": "6"}, (6, "SLURM_JOB_NUM_NODES")),
    (["python3", *TRAIN], {"WORLD_SIZE": "32", "LOCAL_WORLD_SIZE": "8"},
     (4, "WORLD_SIZE/LOCAL_WORLD_SIZE")),
    (["python3", *TRAIN], {"BOOTSEER_JOB_COMPLETIONS": "12", "JOB_COMPLETION_INDEX": "3"},
     (12, "BOOTSEER_JOB_COMPLETIONS")),
    # torchrun's own flag wins over the scheduler's count
    (["torchrun", "--nnodes", "2", *TRAIN], {"SLURM_NNODES": "9"}, (2, "torchrun --nnodes")),
])
def test_node_count_from_each_launcher(argv, env, expected):
    assert job_nodes(argv, env) == expected


@pytest.mark.parametrize("argv, env", [
    (["python3", *TRAIN], {}),
    (["python3", "x.py", "--nnodes", "4"], {}),              # not torchrun's flag
    (["python3", *TRAIN], {"WORLD_SIZE": "32"}),             # ranks without ranks per node
    (["torchrun", "--nnodes", "many", *TRAIN], {"SLURM_NNODES": "0"}),
])
def test_nothing_said_is_no_count(argv, env):
    assert job_nodes(argv, env) is None


def test_job_id_from_slurm_torchrun_or_torchelastic():
    assert job_id(["x"], {"SLURM_JOB_ID": "4711"}) == "4711"
    assert job_id(["torchrun", "--rdzv-id=abc", *TRAIN], {}) == "abc"
    assert job_id(["torchrun", "--rdzv_id", "d", *TRAIN], {}) == "d"
    assert job_id(["x"], {"TORCHELASTIC_RUN_ID": "e"}) == "e"
    assert job_id(["x"], {}) is None


def test_explicit_settings_win_and_the_job_id_is_kept():
    torchrun = ["torchrun", "--nnodes", "4", *TRAIN]
    base = BootseerConfig.from_dict({})
    assert with_job(base, torchrun, {}).peers.nodes == 4
    assert with_job(base, torchrun, {}, nodes_flag=2).peers.nodes == 2
    said = BootseerConfig.from_dict({"peers": {"nodes": 3}})
    assert with_job(said, torchrun, {}).peers.nodes == 3
    assert with_job(base, ["true"], {}).peers.nodes == 1
    named = BootseerConfig.from_dict({"trace": {"job_id": "t"}})
    assert with_job(named, ["true"], {"SLURM_JOB_ID": "s"}).peers.job_id == "t"
    assert with_job(base, ["true"], {"SLURM_JOB_ID": "s"}).peers.job_id == "s"


def test_run_refuses_a_node_count_below_one():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "bootseer", "run", "--nodes", "0", "--", "true"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--nodes" in r.stderr and "Traceback" not in r.stderr
