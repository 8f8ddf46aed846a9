"""The job as the launcher already knows it: how many nodes it has and its id, so that
``bootseer run`` turns peers on for a multi-node start (``auto``: N >= 2) without anyone
setting ``BOOTSEER_PEERS_NODES`` by hand.

Where the node count comes from, first found wins:

1. ``bootseer run --nodes N``, then ``BOOTSEER_PEERS_NODES`` (said explicitly);
2. ``--nnodes N`` / ``--nnodes=N`` / ``--nnodes MIN:MAX`` (the largest) of a torchrun
   command (``torchrun`` or ``python -m torch.distributed.run``/``launch``);
3. Slurm: ``SLURM_NNODES``, ``SLURM_JOB_NUM_NODES``;
4. ``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE`` when both are set (ranks over ranks per node);
5. a Kubernetes Indexed Job: ``BOOTSEER_JOB_COMPLETIONS`` (set it in the pod template to
   the Job's ``spec.completions``: Kubernetes puts only the index in the pod's environment).

The job id (the peers' roster is per job): ``BOOTSEER_PEERS_JOB_ID``, the trace's job id,
``SLURM_JOB_ID``, torchrun's ``--rdzv-id``, ``TORCHELASTIC_RUN_ID``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from bootseer.config import job_completions

log = logging.getLogger(__name__)

COMPLETIONS_VAR = "BOOTSEER_JOB_COMPLETIONS"
_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _torchrun_args(argv: Sequence[str]) -> list[str]:
    """The arguments after torchrun in ``argv`` ([] when CMD is not torchrun)."""
    for i, word in enumerate(argv):
        if os.path.basename(word) == "torchrun":
            return list(argv[i + 1:])
        if word == "-m" and i + 1 < len(argv) and argv[i + 1] in _TORCHRUN_MODULES:
            return list(argv[i + 2:])
    return []


def _option(args: Sequence[str], *names: str) -> str | None:
    """The value of the first of ``names`` in ``args`` (``--x V`` or ``--x=V``)."""
    for i, word in enumerate(args):
        for name in names:
            if word == name and i + 1 < len(args):
                return args[i + 1]
            if word.startswith(name + "="):
                return word[len(name) + 1:]
    return None


def _count(text: str | None) -> int | None:
    """A node count: ``N``, or torchrun's elastic ``MIN:MAX`` (the most it may have)."""
    if text is None:
        return None
    try:
        n = max(int(part) for part in text.split(":"))
    except ValueError:
        return None
    return n if n > 0 else None


def job_nodes(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, str] | None:
    """(nodes, where it came from) derived from the launcher, or None when nothing says."""
    n = _count(_option(_torchrun_args(argv), "--nnodes"))
    if n:
        return n, "torchrun --nnodes"
    for var in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        n = _count(env.get(var))
        if n:
            return n, var
    world, local = _count(env.get("WORLD_SIZE")), _count(env.get("LOCAL_WORLD_SIZE"))
    if world and local:
        return -(-world // local), "WORLD_SIZE/LOCAL_WORLD_SIZE"
    n = _count(job_completions(env))
    if n:
        return n, COMPLETIONS_VAR
    return None


def job_id(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The launcher's id for the job, shared by every node (None when none is known)."""
    return (env.get("SLURM_JOB_ID") or _option(_torchrun_args(argv), "--rdzv-id", "--rdzv_id")
            or env.get("TORCHELASTIC_RUN_ID") or None)


def with_job(config, argv: Sequence[str], env: Mapping[str, str], nodes_flag: int | None = None):
    """``config`` with ``peers.nodes`` and ``peers.job_id`` filled in from the launcher
    where the settings leave them unset (an explicit ``--nodes`` wins over everything)."""
    p = config.peers
    if nodes_flag:
        nodes, source = nodes_flag, "--nodes"
    elif p.nodes:
        nodes, source = p.nodes, "BOOTSEER_PEERS_NODES"
    else:
        nodes, source = job_nodes(argv, env) or (1, "default: no launcher said")
    job = p.job_id or config.trace.job_id or job_id(argv, env)
    log.info("peers: a job of %d node(s) (from %s)", nodes, source)
    return config.replace(peers={"nodes": nodes, "job_id": job})
