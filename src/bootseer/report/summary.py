"""Explain one attempt from its views: time to ready, per-phase breakdown across nodes, the
critical path, stragglers (median + k*MAD), a what-if without stragglers, GPU-seconds lost,
the job's phases per rank and the techniques' figures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bootseer.report import critical_path as cp
from bootseer.report import sources
from bootseer.report.views import COLLECTIVES, RANK_COLUMN, UNTRACED, AttemptView, NodeView, covered

K_MAD = 3.0


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return 0.0
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass(frozen=True, slots=True)
class PhaseStats:
    """One top-level phase over the nodes that ran it: seconds, how many nodes, and the
    seconds of all of them together."""
    median: float
    p90: float
    max: float
    n: int
    sum: float


@dataclass(frozen=True, slots=True)
class PathStep:
    """One segment of the gating node's critical path, as the summary reports it."""
    node: str
    phase: str
    lane: str
    start: float
    end: float
    seconds: float


@dataclass(frozen=True)
class Summary:
    attempt: int
    nodes: int
    time_to_ready: float | None
    not_ready: list[str]
    alignment: str
    phases: dict[str, PhaseStats]
    gating_node: str | None
    gating_phase: str | None
    gating_rank: int | None
    stragglers: list[str]
    k: float
    what_if: float | None
    gpu_seconds_lost: float
    critical_path: list[PathStep] = field(default_factory=list)   # the gating node's chain
    path_shares: dict[str, float] = field(default_factory=dict)  # seconds per pipeline on it
    ranks: list[dict] = field(default_factory=list)            # the job's phases per rank
    figures: dict[str, dict] = field(default_factory=dict)     # technique figures (medians)
    # bytes by source (report/sources.py): job totals per pipeline, and per node
    # {node: {pipeline: [origin, peers, role]}} for the nodes that traced any
    sources: dict[str, dict] = field(default_factory=dict)
    node_sources: dict[str, dict] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _gating_phase(slow: NodeView, phases: dict[str, PhaseStats], *,
                  straggler: bool) -> str | None:
    """A straggler was gated by the phase that exceeds its cross-node median the most
    (what made it late). A node in step with the others was gated by its longest phase;
    phases traced in parallel threads overlap (``startup.prepare`` spans ``image.pull``), so
    among phases within 2 % of the longest, the innermost (shortest) is named."""
    own = {p: v for p, v in slow.phases.items() if p != UNTRACED} or slow.phases
    if not own:
        return None
    if straggler:
        return max(own, key=lambda p: (own[p] - phases[p].median, own[p]))
    longest = max(own.values())
    return min((p for p, v in own.items() if v >= 0.98 * longest), key=lambda p: own[p])


def summarize(view: AttemptView, k: float = K_MAD) -> Summary:
    names = sorted({p for n in view.nodes for p in n.phases})
    phases = {}
    for name in names:
        vals = [n.phases[name] for n in view.nodes if name in n.phases]
        phases[name] = PhaseStats(statistics.median(vals), pct(vals, 0.9), max(vals), len(vals),
                                  sum(vals))
    per_node = {n.node: src for n in view.nodes if (src := sources.node_sources(n))}
    done = [(n, n.ready) for n in view.nodes if n.ready is not None]   # (node, its ready)
    gating_node = gating_phase = gating_rank = None
    path: list = []
    stragglers: list[str] = []
    what_if = None
    if done:
        slow = max(done, key=lambda d: d[1])[0]
        gating_node, gating_rank = slow.node, slow.last_rank
        readies = [r for _, r in done]
        med = statistics.median(readies)
        mad = statistics.median(abs(r - med) for r in readies) * 1.4826
        limit = med + k * max(mad, 1e-9)
        stragglers = [n.node for n, r in done if r > limit and len(done) > 2]
        gating_phase = _gating_phase(slow, phases, straggler=slow.node in stragglers)
        path = cp.node_path(slow, view)
        real = [x for x in path if x.phase not in (UNTRACED, cp.NOT_STARTED)]
        if real and slow.node not in stragglers:
            # in step with the others: the phase that held the critical path longest gated
            # (on the node that held it: the last to reach the rendezvous, if it crossed)
            top = max(real, key=lambda x: x.seconds)
            by_name = {n.node: n for n in view.nodes}
            gating_node, gating_phase = top.node, top.phase
            gating_rank = by_name[top.node].last_rank
        fixed = []
        for n, ready in done:
            excess = sum(max(0.0, v - phases[p].median) for p, v in n.phases.items()) \
                if n.node in stragglers else 0.0
            fixed.append(max(ready - excess, 0.0))
        what_if = max(fixed)
    ttr = view.ready
    wait = ttr if ttr is not None else max((n.last_end for n in view.nodes), default=0.0)
    gpu_lost = sum(n.gpus for n in view.nodes) * wait
    return Summary(view.attempt, len(view.nodes), ttr, [n.node for n in view.not_ready],
                   view.alignment, phases, gating_node, gating_phase, gating_rank, stragglers, k,
                   what_if, gpu_lost,
                   critical_path=[PathStep(x.node, x.phase, x.lane, x.start, x.end, x.seconds)
                                  for x in path],
                   path_shares=cp.shares(path), ranks=rank_rows(view),
                   figures=technique_figures(view), sources=sources.job_sources(per_node),
                   node_sources=per_node, problems=list(view.problems))


def model_build(cols: dict) -> float | None:
    """A rank's model build, as its events bound it: from the end of its last import (a
    worker served warm, which imports nothing itself: from when it was forked) to
    the start of its first collective (or its checkpoint load, whichever comes first), less
    its ``dist.init`` in between (None: no imports, or nothing after them)."""
    imports = cols.get("imports") or cols.get("warm start")
    after = [s for c in ("first collective", "ckpt.load") for s, _ in cols.get(c, [])]
    if not imports or not after:
        return None
    start = max(en for _, en in imports)
    end = min(after)
    if end <= start:
        return None
    inside = [(max(s, start), min(en, end)) for s, en in cols.get("dist.init", [])
              if en > start and s < end]
    return end - start - covered(inside)


def warm_text(attrs: dict | None) -> str | None:
    """A rank's ``job.warm`` outcome: "hit", "miss: why" (None: not a warm start)."""
    if attrs is None:
        return None
    return "hit" if attrs.get("hit") else f"miss: {attrs.get('why', '?')}"


def rank_rows(view: AttemptView) -> list[dict]:
    """Per node and rank: seconds in each of the job's phases, how long the rank waited at
    the first collective for the slowest one (its ``dist.first_collective``, else its
    ``dist.init``, less the shortest of the attempt: the last rank to arrive waited for no
    one; durations, so clock skew does not matter), when it was ready, its model build
    (:func:`model_build`) and, in a warm start, whether its worker was served warm."""
    rows = []
    for n in view.nodes:
        readies = n.rank_ready
        for who, cols in n.rank_phases.items():   # (a rank with only job.warm: no row)
            row = {"node": n.node, "rank": who, "ready": readies.get(who)}
            row.update({col: covered(iv) for col, iv in cols.items()})
            build = model_build(cols)
            if build is not None:
                row["model build"] = build
            warm = warm_text(n.rank_warm.get(who))
            if warm is not None:
                row["warm"] = warm
                if n.rank_warm[who].get("launcher"):   # torchrun itself, not a rank
                    row["launcher"] = n.rank_warm[who]["launcher"]
            rows.append(row)
    col = next((RANK_COLUMN[p] for p in COLLECTIVES
                if any(RANK_COLUMN[p] in r for r in rows)), None)
    floor = min((r[col] for r in rows if col in r), default=0.0)
    for r in rows:
        r["rendezvous_wait"] = r[col] - floor if col in r else None
    return rows


# the per-rank table's columns of seconds, in the order a job runs them
RANK_TABLE_COLUMNS = ("interpreter", "imports", "dist.init", "model build", "first collective",
                      "ckpt.load", "model.init", "first step")


def job_init_line(ranks: list[dict]) -> str | None:
    """The job's own init split for the reader (medians over ranks): imports, model build,
    and how many workers a warm start served from the zygote (with the misses' reasons)."""
    parts = []
    for col in ("imports", "model build"):
        vals = [r[col] for r in ranks if r.get(col) is not None]
        if vals:
            parts.append(f"{col} {statistics.median(vals):.2f} s")
    for what, launchers in (("ranks", False), ("launchers", True)):
        warm = [r["warm"] for r in ranks if r.get("warm") and bool(r.get("launcher")) == launchers]
        if warm:
            hits = sum(1 for w in warm if w == "hit")
            whys = sorted({w[len("miss: "):] for w in warm if w != "hit"})
            parts.append(f"served warm {hits} of {len(warm)} {what}"
                         + (f" (cold: {'; '.join(whys)})" if whys else ""))
    return "job init (median over ranks): " + ", ".join(parts) if parts else None


def technique_figures(view: AttemptView) -> dict[str, dict]:
    """Medians over nodes of what each technique reported: image coverage, precision and
    stalls (the ``image.window`` mark), dependency restore/build/install times, checkpoint
    throughput, first byte and stalls (``ckpt.load``)."""
    img: dict[str, list] = {}
    deps: dict[str, list] = {}
    ckpt: dict[str, list] = {}
    for n in view.nodes:
        for attrs in n.windows:
            for key in ("coverage", "precision", "stall_s", "store_bytes", "window_s"):
                v = attrs.get(key)
                if isinstance(v, (int, float)):
                    img.setdefault(key, []).append(float(v))
        for phase in ("deps.restore", "deps.build", "deps.install"):
            if phase in n.phases:
                deps.setdefault(phase.split(".")[1] + "_s", []).append(n.phases[phase])
        for a, dur in n.ckpt_loads:
            size = a.get("bytes_consumed", a.get("bytes"))
            if isinstance(size, (int, float)) and dur > 0:
                ckpt.setdefault("mb_per_s", []).append(size / dur / 1e6)
                ckpt.setdefault("mb", []).append(size / 1e6)
            for key in ("first_byte_s", "stall_s"):
                if isinstance(a.get(key), (int, float)):
                    ckpt.setdefault(key, []).append(float(a[key]))
    out = {}
    for name, d in (("image", img), ("deps", deps), ("ckpt", ckpt)):
        if d:
            out[name] = {k: statistics.median(v) for k, v in d.items()}
            out[name]["nodes"] = max(len(v) for v in d.values())
    return out
