"""Explain one job from its events: time to ready, per-phase breakdown across nodes, the
critical path, stragglers (median + k*MAD), a what-if without stragglers, GPU-seconds lost.

Clocks: nodes disagree. If every node of an attempt recorded a ``rendezvous`` mark, node
clocks are shifted so those marks coincide (the rendezvous is one instant for the whole
job); otherwise wall clocks are used as they are (NTP-synchronised). The report says which.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

K_MAD = 3.0
UNTRACED = "(untraced)"   # time to ready not covered by any top-level phase on the node


def _covered(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


@dataclass
class NodeView:
    node: str
    gpus: int
    start: float
    ready: float | None
    phases: dict[str, float] = field(default_factory=dict)   # top-level phase -> seconds
    spans: list[dict] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    last_rank: int | None = None                              # the rank that was ready last
    missing_ranks: list[int] = field(default_factory=list)    # ranks that never got ready

    @property
    def to_ready(self) -> float | None:
        return None if self.ready is None else self.ready


@dataclass
class AttemptView:
    attempt: int
    nodes: list[NodeView]
    t0: float
    alignment: str

    @property
    def ready(self) -> float | None:
        vals = [n.ready for n in self.nodes]
        return None if any(v is None for v in vals) or not vals else max(vals)

    @property
    def not_ready(self) -> list[NodeView]:
        return [n for n in self.nodes if n.ready is None]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return 0.0
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def attempts(events: list[dict]) -> list[AttemptView]:
    by_attempt: dict[int, list[dict]] = {}
    for e in events:
        by_attempt.setdefault(int(e["attempt"]), []).append(e)
    return [_attempt(a, evs) for a, evs in sorted(by_attempt.items())]


def _attempt(attempt: int, events: list[dict]) -> AttemptView:
    by_node: dict[str, list[dict]] = {}
    for e in events:
        by_node.setdefault(str(e["node"]), []).append(e)
    offsets = {n: 0.0 for n in by_node}
    rdzv = {n: next((e["start"] for e in evs if e.get("kind") == "mark"
                     and e["phase"] == "rendezvous"), None) for n, evs in by_node.items()}
    alignment = "wall clock (NTP)"
    if len(by_node) > 1 and all(v is not None for v in rdzv.values()):
        ref = statistics.median(rdzv.values())
        offsets = {n: ref - v for n, v in rdzv.items()}
        alignment = "rendezvous marks"
    t0 = min(min(e["start"] for e in evs) + offsets[n] for n, evs in by_node.items())
    nodes = []
    for n, evs in sorted(by_node.items()):
        off = offsets[n]
        # a node is ready when every training rank on it is (the last rank's ready mark);
        # a rank that wrote events but no ready mark was killed or failed first. Keyed by
        # rank, not process: helpers started for a rank (a mount's server reporting its
        # load) carry the rank's RANK and never mark ready themselves.
        readies: dict = {}
        for e in evs:
            if e.get("kind") == "mark" and e["phase"] == "ready":
                who = e["rank"] if e.get("rank") is not None else ("pid", e.get("pid"))
                readies[who] = max(readies.get(who, float("-inf")), e["start"] + off - t0)
        ranks = {e["rank"] for e in evs if e.get("rank") is not None}
        missing = [r for r in ranks if r not in readies]
        ready = max(readies.values()) if readies and not missing else None
        last = max(readies, key=readies.get) if readies else None
        view = NodeView(node=n, gpus=max(int(e.get("gpus") or 0) for e in evs),
                        start=min(e["start"] for e in evs) + off - t0, ready=ready,
                        last_rank=last if last in ranks else None,
                        missing_ranks=sorted(missing, key=str))
        per_pid: dict[str, dict] = {}
        for e in evs:
            if e.get("kind") == "mark":
                continue
            s, en = e["start"] + off - t0, e["end"] + off - t0
            view.spans.append({"phase": e["phase"], "start": s, "end": en,
                               "status": e.get("status", "ok"), "parent": e.get("parent"),
                               "pid": e.get("pid"), "attrs": e.get("attrs") or {}})
            if e.get("status") == "failed":
                view.failed.append(e["phase"])
            if not e.get("parent"):
                # the breakdown explains the time to ready: what a phase spends after the
                # node is ready (the job itself, a mount reporting at unmount) is not startup
                took = (min(en, ready) - s) if ready is not None else en - s
                if ready is None or s < ready:
                    per_pid.setdefault(e["phase"], {}).setdefault(e.get("pid"), []).append(
                        max(0.0, took))
        # several processes on one node (ranks) run a phase side by side: the node's time
        # in a phase is its slowest process's (sum over that process's spans)
        view.phases = {p: max(sum(v) for v in by_pid.values()) for p, by_pid in per_pid.items()}
        if ready is not None:  # time before ready that no top-level phase covers
            gap = ready - view.start - _covered(
                [(x["start"], min(x["end"], ready)) for x in view.spans
                 if not x["parent"] and x["start"] < ready])
            if gap > 1e-3:
                view.phases[UNTRACED] = gap
        nodes.append(view)
    return AttemptView(attempt, nodes, t0, alignment)


@dataclass
class Summary:
    attempt: int
    nodes: int
    time_to_ready: float | None
    not_ready: list[str]
    alignment: str
    phases: dict[str, dict]            # name -> median/p90/max/n
    gating_node: str | None
    gating_phase: str | None
    gating_rank: int | None
    stragglers: list[str]
    k: float
    what_if: float | None
    gpu_seconds_lost: float


def _gating_phase(slow: NodeView, phases: dict, *, straggler: bool) -> str | None:
    """A straggler was gated by the phase that exceeds its cross-node median the most
    (what made it late). A node in step with the others was gated by its longest phase;
    phases traced in parallel threads overlap (``startup.prepare`` spans ``image.pull``), so
    among phases within 2 % of the longest, the innermost (shortest) is named."""
    own = {p: v for p, v in slow.phases.items() if p != UNTRACED} or slow.phases
    if not own:
        return None
    if straggler:
        return max(own, key=lambda p: (own[p] - phases[p]["median"], own[p]))
    longest = max(own.values())
    return min((p for p, v in own.items() if v >= 0.98 * longest), key=lambda p: own[p])


def summarize(view: AttemptView, k: float = K_MAD) -> Summary:
    names = sorted({p for n in view.nodes for p in n.phases})
    phases = {}
    for name in names:
        vals = [n.phases[name] for n in view.nodes if name in n.phases]
        phases[name] = {"median": statistics.median(vals), "p90": pct(vals, 0.9),
                        "max": max(vals), "n": len(vals)}
    done = [n for n in view.nodes if n.ready is not None]
    gating_node = gating_phase = gating_rank = None
    stragglers: list[str] = []
    what_if = None
    if done:
        slow = max(done, key=lambda n: n.ready)
        gating_node, gating_rank = slow.node, slow.last_rank
        readies = [n.ready for n in done]
        med = statistics.median(readies)
        mad = statistics.median(abs(r - med) for r in readies) * 1.4826
        limit = med + k * max(mad, 1e-9)
        stragglers = [n.node for n in done if n.ready > limit and len(done) > 2]
        gating_phase = _gating_phase(slow, phases, straggler=slow.node in stragglers)
        fixed = []
        for n in done:
            excess = sum(max(0.0, v - phases[p]["median"]) for p, v in n.phases.items()) \
                if n.node in stragglers else 0.0
            fixed.append(max(n.ready - excess, 0.0))
        what_if = max(fixed)
    ttr = view.ready
    wait = ttr if ttr is not None else max((s["end"] for n in view.nodes for s in n.spans),
                                           default=0.0)
    gpu_lost = sum(n.gpus for n in view.nodes) * wait
    return Summary(view.attempt, len(view.nodes), ttr, [n.node for n in view.not_ready],
                   view.alignment, phases, gating_node, gating_phase, gating_rank, stragglers, k, what_if,
                   gpu_lost)
