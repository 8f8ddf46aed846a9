"""A cluster startup simulator that writes traces in bootseer's formats.

Model (every assumption is listed in docs/simulator.md): jobs arrive uniformly over a day;
job sizes follow a mix over the GPU bins; a job of G GPUs runs on ceil(G/8) nodes; every
attempt (the first start and each restart) draws, per node, the durations of the startup
phases; a node is ready when its phases are done (in sequence, or overlapped with the
``overlap`` technique); the job is ready at the slowest node. Shared bottlenecks: image
pulls share the registry bandwidth and checkpoint reads share the storage bandwidth among
the N nodes starting at once. Per-node noise is log-normal plus rare Pareto stragglers.
A per-bin calibration factor scales all phases so that the default model reproduces the
published per-bin median startup times; see :data:`CALIBRATION`.

Output: ``<out>/cluster.jsonl``, one JSON line per job attempt (the compact form read by
``bootseer analyze`` and ``bootseer report``), and optionally full per-node event traces
for the first jobs under ``<out>/traces/`` (the recorder's format).
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import asdict, dataclass

BINS = [(1, 10), (10, 100), (100, 500), (500, 1000), (1000, 2000), (2000, 3000), (3000, 8192)]
BIN_NAMES = ["1-10", "10-100", "100-500", "500-1000", "1000-2000", "2000-3000", ">3000"]
TARGET_MEDIANS = [45, 127, 334, 314, 410, 432, 501]   # s, per bin (the paper's figure)
TARGET_LOST_SHARE = 0.035                             # of cluster GPU time
TECHNIQUES = ("image", "deps", "ckpt", "overlap", "peers")
# Per-bin factors on all phase durations, fitted once so that the default model (seed 0,
# 30,000 jobs) hits TARGET_MEDIANS; the shape within a bin comes from the model.
CALIBRATION = [0.698, 1.524, 3.374, 2.572, 2.261, 1.546, 0.736]


def bin_of(gpus: int) -> int:
    for i, (lo, hi) in enumerate(BINS):
        if gpus <= hi if i == 0 else lo < gpus <= hi:
            return i
    return len(BINS) - 1


@dataclass(frozen=True)
class SimParams:
    jobs: int = 30000
    seed: int = 0
    day_s: float = 86400.0
    """Jobs arrive uniformly over this window (s)."""
    bin_weights: tuple = (0.55, 0.27, 0.10, 0.04, 0.025, 0.01, 0.005)
    """Share of jobs per GPU bin."""
    gpus_per_node: int = 8
    image_gb: float = 15.0
    """Container image size (GB) pulled by every node."""
    node_gbps: float = 1.25
    """One node's network bandwidth (GB/s)."""
    registry_gbps: float = 80.0
    """Registry (plus mirrors) bandwidth shared by the nodes of a job starting at once (GB/s)."""
    storage_gbps: float = 100.0
    """Checkpoint storage bandwidth shared by the nodes of a job (GB/s)."""
    ckpt_gb_per_gpu: float = 1.5
    """Checkpoint bytes per GPU (model + optimizer state, sharded)."""
    deps_s: float = 30.0
    """Median per-node dependency install (s)."""
    sigma: float = 0.25
    """Log-normal spread of per-node phase durations."""
    straggler_p: float = 0.004
    """Chance that a node's phase is a straggler (x Pareto(alpha=1.5) slowdown)."""
    train_median_h: float = 7.0
    """Median training time of a job (h), log-normal with sigma 0.8."""
    failures_per_gpu_hour: float = 0.00005
    """Restarts: Poisson with this rate times GPU-hours of training."""
    max_restarts: int = 40
    peer_origin_copies: float = 1.03
    """With ``peers``: times the registry serves a hot set per job start, whatever the node
    count (bench/scale, N = 2 to 8: 1.00-1.03)."""
    peer_node_gbps: float = 1.25
    """With ``peers``: one node's rate of receiving from its peers (GB/s): its NIC. (On the
    2-core bench machine 8 nodes shared the cores and got 10 MB/s each: CPU, not network.)"""
    ckpt_shared_by: int = 1
    """Nodes that read the same checkpoint bytes (data-parallel replicas across nodes, e.g.
    HSDP: sharded within a node, replicated across nodes); 1: every node its own shard,
    nothing for ``peers`` to share."""
    peer_join_s: float = 1.0
    """With ``peers``: joining the job's swarm: the roster read and the calls (bench/scale:
    up to a second, libtorrent's round of calls)."""
    techniques: tuple = ()
    calibration: tuple = tuple(CALIBRATION)


PHASES = ("container.create", "image.pull", "deps.install", "ckpt.load", "dist.init", "model.init")


def _node_phases(p: SimParams, rnd: random.Random, nodes: int, gpus: int, cal: float) -> dict:
    """Median-level (noise-free) seconds of each phase on one node of this job."""
    t = set(p.techniques)
    share_reg = min(p.node_gbps, p.registry_gbps / nodes)
    image = p.image_gb / share_reg
    if "image" in t:  # lazy image: only the hot blocks (~15%) before start
        image = set_fetch_s(p, 0.15 * p.image_gb, nodes, "peers" in t) + 2.0
    deps = 3.0 if "deps" in t else p.deps_s   # snapshot restore vs resolve+install
    ckpt = ckpt_fetch_s(p, p.ckpt_gb_per_gpu * min(gpus, p.gpus_per_node), nodes)
    return {"container.create": 5.0 * cal, "image.pull": image * cal,
            "deps.install": deps * cal, "ckpt.load": ckpt * cal,
            "dist.init": (2.0 + 1.5 * math.log2(nodes + 1)) * cal, "model.init": 8.0 * cal}


def set_fetch_s(p: SimParams, gb: float, nodes: int, peers: bool) -> float:
    """Seconds for every node of a job starting at once to hold a set of ``gb``. From the
    registry alone, the nodes share its bandwidth. With peers (2 nodes or more), the
    registry serves the set ``peer_origin_copies`` times in all, in segments dealt out to
    the nodes, which pass them on as they arrive: a node is done when the registry has sent
    the set and the node has received it from its peers, after joining the swarm."""
    if not peers or nodes < 2:
        return gb / min(p.node_gbps, p.registry_gbps / nodes)
    origin = p.peer_origin_copies * gb / min(p.registry_gbps, nodes * p.node_gbps)
    return p.peer_join_s + max(origin, gb / min(p.node_gbps, p.peer_node_gbps))


def ckpt_fetch_s(p: SimParams, gb: float, nodes: int) -> float:
    """Seconds for a node to hold its ``gb`` of checkpoint. Striped reads (``ckpt``) get 4x
    a node's single stream and twice the storage's efficiency. With ``peers`` and nodes
    sharing shards (``ckpt_shared_by``), the storage serves each distinct byte about once
    (``peer_origin_copies``) and the nodes of a replica group pass it on as it arrives."""
    # (bench/scale's ckpt sets: 1.00-1.01x the checkpoint from the origin at N = 2 to 8)
    t = set(p.techniques)
    node = p.node_gbps * (4 if "ckpt" in t else 1)
    storage = p.storage_gbps * (2 if "ckpt" in t else 1)
    group = min(max(1, p.ckpt_shared_by), nodes)
    if "peers" not in t or group < 2:
        return gb / min(node, storage / nodes)
    distinct = gb * nodes / group
    origin = p.peer_origin_copies * distinct / min(storage, nodes * node)
    # many peers at once, like many range streams from storage: the node's striped rate
    return p.peer_join_s + max(origin, gb / node)


@dataclass(frozen=True)
class Projection:
    """One start of a job, noise-free: per-node phase seconds, time to ready, and what the
    origins serve (GB)."""
    gpus: int
    nodes: int
    phases: dict[str, float]
    ready_s: float
    registry_gb: float
    """The image's bytes the registry serves."""
    storage_gb: float
    """The checkpoint's bytes its storage serves."""


@dataclass(frozen=True)
class SimulationRun:
    """What :func:`simulate` wrote: the attempts file and its counts."""
    path: str
    jobs: int
    attempts: int


def project(p: SimParams, gpus: int) -> Projection:
    """Noise-free per-node phase seconds of one start of a job of ``gpus`` GPUs (the
    calibration of its bin applied), its time to ready, and the bytes the registry serves
    for the image (GB); for projecting a technique to a scale (docs/peers.md)."""
    nodes = max(1, math.ceil(gpus / p.gpus_per_node))
    t = set(p.techniques)
    base = _node_phases(p, random.Random(0), nodes, gpus, p.calibration[bin_of(gpus)])
    if "overlap" in t:
        ready = (base["container.create"] + max(base["image.pull"], base["deps.install"],
                                                base["ckpt.load"])
                 + base["dist.init"] + base["model.init"])
    else:
        ready = sum(base.values())
    image_gb = 0.15 * p.image_gb if "image" in t else p.image_gb
    copies = p.peer_origin_copies if "peers" in t and "image" in t and nodes > 1 else nodes
    ckpt_gb = p.ckpt_gb_per_gpu * min(gpus, p.gpus_per_node) * nodes   # distinct shards...
    group = min(max(1, p.ckpt_shared_by), nodes)
    ckpt_gb = ckpt_gb / group * (p.peer_origin_copies if "peers" in t and group > 1 else group)
    return Projection(gpus=gpus, nodes=nodes, phases=base, ready_s=ready,
                      registry_gb=image_gb * copies, storage_gb=ckpt_gb)


def _attempt(p: SimParams, rnd: random.Random, nodes: int, base: dict):
    """One start: per-node draws; returns (ready_s, per-phase per-node lists, gating idx)."""
    sig, sp = p.sigma, p.straggler_p
    gauss, expo = rnd.gauss, math.exp
    per = {}
    for k, m in base.items():
        v = [m * expo(gauss(0.0, sig)) for _ in range(nodes)]
        # rare stragglers: Binomial(nodes, sp) of them, each slowed by a Pareto(1.5) factor
        hits = sum(1 for _ in range(nodes) if rnd.random() < sp) if nodes < 50 else \
            max(0, int(round(gauss(nodes * sp, math.sqrt(nodes * sp)))))
        for i in rnd.sample(range(nodes), min(hits, nodes)):
            v[i] *= (1.0 - rnd.random()) ** (-1 / 1.5)
        per[k] = v
    if "overlap" in p.techniques:  # image, deps and checkpoint fetches run side by side
        totals = [c + max(i, d, k) + x + m for c, i, d, k, x, m in zip(*per.values(), strict=True)]
    else:
        totals = [sum(t) for t in zip(*per.values(), strict=True)]
    gi = max(range(nodes), key=totals.__getitem__)
    return totals[gi], per, gi


def simulate(p: SimParams, out: str, events_jobs: int = 0) -> SimulationRun:
    """Write ``<out>/cluster.jsonl`` (and traces for the first ``events_jobs`` jobs)."""
    rnd = random.Random(p.seed)
    os.makedirs(out, exist_ok=True)
    cum, acc = [], 0.0
    for w in p.bin_weights:
        acc += w
        cum.append(acc / sum(p.bin_weights))
    path = os.path.join(out, "cluster.jsonl")
    lines = [json.dumps({"v": 1, "kind": "simulation", "params": asdict(p)})]
    n_attempts = 0
    for j in range(p.jobs):
        # one generator per job: a job's draws do not depend on the jobs before it
        rnd = random.Random(p.seed * 1_000_003 + j)
        u = rnd.random()
        b = next(i for i, c in enumerate(cum) if u <= c)
        lo, hi = BINS[b]
        gpus = max(1, int(math.exp(rnd.uniform(math.log(max(lo, 1)), math.log(hi)))))
        if b > 0 and gpus <= lo:
            gpus = lo + 1
        if gpus >= 8:
            gpus -= gpus % 8  # whole nodes above one node
        gb = bin_of(gpus)
        nodes = max(1, math.ceil(gpus / p.gpus_per_node))
        train_s = 3600 * p.train_median_h * math.exp(rnd.gauss(0.0, 0.8))
        lam = p.failures_per_gpu_hour * gpus * train_s / 3600
        restarts = min(_poisson(rnd, lam), p.max_restarts)
        t = rnd.uniform(0, p.day_s)
        base = _node_phases(p, rnd, nodes, gpus, p.calibration[gb])
        job = f"sim-{j:05d}"
        for a in range(restarts + 1):
            ready, per, gi = _attempt(p, rnd, nodes, base)
            seg = train_s / (restarts + 1)
            phases = {k: [_median(v), max(v)] for k, v in per.items()}
            gating_phase = max(per, key=lambda k: per[k][gi] - phases[k][0])
            lines.append(json.dumps({"v": 1, "kind": "attempt", "job": job, "attempt": a,
                                     "gpus": gpus, "nodes": nodes, "t": round(t, 1),
                                     "ready": round(ready, 2), "train": round(seg, 1),
                                     "phases": {k: [round(x, 2) for x in v]
                                                for k, v in phases.items()},
                                     "gating_node": f"node{gi}", "gating_phase": gating_phase},
                                    separators=(",", ":")))
            if j < events_jobs:
                _write_events(out, job, a, t, gpus, nodes, per, ready)
            t += ready + seg
            n_attempts += 1
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return SimulationRun(path=path, jobs=p.jobs, attempts=n_attempts)


def _write_events(out, job, attempt, t0, gpus, nodes, per, ready) -> None:
    d = os.path.join(out, "traces", job, str(attempt))
    os.makedirs(d, exist_ok=True)
    g = min(gpus, 8)
    for i in range(nodes):
        s, lines = t0, []
        for k in PHASES:
            e = s + per[k][i]
            lines.append({"v": 1, "job": job, "attempt": attempt, "node": f"node{i}", "rank": None,
                          "gpus": g, "pid": 1, "kind": "span", "phase": k, "parent": None,
                          "start": s, "end": e, "status": "ok", "attrs": {}})
            s = e
        lines.append({"v": 1, "job": job, "attempt": attempt, "node": f"node{i}", "gpus": g,
                      "pid": 1, "kind": "mark", "phase": "ready", "start": s, "end": s})
        with open(os.path.join(d, f"node{i}-1.jsonl"), "w") as f:
            f.write("".join(json.dumps(x) + "\n" for x in lines))


def _median(v: list[float]) -> float:
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _poisson(rnd: random.Random, lam: float) -> int:
    if lam > 30:  # normal approximation: exact sampling is slow for big rates
        return max(0, int(round(rnd.gauss(lam, math.sqrt(lam)))))
    k, p, lim = 0, 1.0, math.exp(-lam)
    while True:
        p *= rnd.random()
        if p <= lim:
            return k
        k += 1
