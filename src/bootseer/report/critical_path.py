"""The critical path of a start: the chain of phases that determined the gating node's time
to ready, walked back from its ready instant.

At each instant ``t`` (first the node's ready mark) the walk asks what the node was waiting
on: the top-level phase that finished last at or before ``t`` (the work ``t`` waited for);
or, when none finished just then, the phase still running at ``t`` that started latest (the
work in progress, e.g. ``job.run`` starting the interpreter after the image was ready). That
phase holds the path from its start (or from the end of the last phase finished inside it)
to ``t``, and the walk goes on from there. Time no phase covers is ``(untraced)``; the time
before the node's first event, while other nodes had started, is ``(not started)``.

Nodes wait on each other at the first collective: when the walk reaches the first
collective (``dist.first_collective``, else ``dist.init``) and another rank arrived there
later, it goes on from that rank's arrival on the node of the last rank to arrive, since
that node's start is what the wait waited on.

Phases running in parallel that did not gate (the deps pipeline ending before the image
pipeline) are not on the path: the path's segments never overlap and add up to the time to
ready, which summed medians of overlapping phases do not.
"""

from __future__ import annotations

from dataclasses import dataclass

from bootseer.report.views import COLLECTIVES, UNTRACED, AttemptView, NodeView, pipeline_of

EPS_S = 1e-3
WRAPPERS = {"startup"}
NOT_STARTED = "(not started)"


@dataclass
class Segment:
    phase: str
    lane: str
    start: float
    end: float
    node: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def pipeline(self) -> str:
        return self.lane.split(" ", 1)[0] if self.lane else self.phase


def node_path(node: NodeView, view: AttemptView | None = None) -> list[Segment]:
    """The gating chain of one ready node, earliest first (empty if it never got ready);
    with the attempt's ``view``, it follows a rendezvous wait to the last rank to arrive."""
    if node.ready is None:
        return []
    last_in = _last_arrival(view) if view is not None else None
    out: list[Segment] = []
    t, hopped = node.ready, False
    prev = None   # the phase whose start t is
    while t > node.start + EPS_S:
        work, wrappers = _tops(node)
        before = [s for s in work if s["start"] < t - EPS_S]
        finished = [s for s in before if s["end"] <= t + EPS_S]
        last_end = max((s["end"] for s in finished), default=float("-inf"))
        if last_end >= t - EPS_S:   # what t waited on: finished just then (innermost first)
            s = min((s for s in finished if s["end"] >= last_end - EPS_S),
                    key=lambda s: (s["end"] - s["start"], s["lane"]))
            lo = s["start"]
            if last_in is not None and s["phase"] == last_in[1]["phase"] and not hopped \
                    and last_in[1]["start"] > lo + EPS_S and last_in[0] is not node:
                # waited at the rendezvous for a later rank: go on on that rank's node
                lo = min(last_in[1]["start"], t)
                out.append(Segment(s["phase"], s["lane"], lo, t, node.node))
                node, t, hopped, prev = last_in[0], lo, True, None
                continue
            out.append(Segment(s["phase"], s["lane"], lo, t, node.node))
            t, prev = lo, s
            continue
        # work in progress at t, back to the last phase finished inside it; a pipeline
        # thread's start waited on the wrapper that started it, not on its sibling threads
        running = [w for w in wrappers if prev is not None and w["pid"] == prev["pid"]
                   and w["start"] < t - EPS_S and prev["end"] <= w["end"] + EPS_S] \
            or [s for s in before if s["end"] > t + EPS_S]
        prev = None
        if running:
            s = max(running, key=lambda s: (s["start"], -(s["end"] - s["start"])))
            lo = max(s["start"], last_end)
            out.append(Segment(s["phase"], s["lane"], lo, t, node.node))
            t, prev = lo, (s if lo == s["start"] else None)
            continue
        floor = max(last_end, node.start)
        wrap = max((w for w in wrappers if w["start"] < t - EPS_S and w["end"] > floor + EPS_S),
                   key=lambda w: min(w["end"], t), default=None)
        if wrap is not None and wrap["end"] >= t - EPS_S:
            # the wrapper's own time around what it waited for (joining its threads)
            lo = max(wrap["start"], floor)
            out.append(Segment(wrap["phase"], wrap["lane"], lo, t, node.node))
        else:   # nothing traced; back to the end of the last phase or wrapper before t
            lo = max(floor, wrap["end"]) if wrap is not None else floor
            out.append(Segment(UNTRACED, "", lo, t, node.node))
        t = lo
    if node.start > EPS_S:
        out.append(Segment(NOT_STARTED, "", 0.0, node.start, node.node))
    return _merged(out[::-1])


def _tops(node: NodeView) -> tuple[list[dict], list[dict]]:
    """The node's top-level phases: those that did work, and wrappers (``startup.*``, which
    bootseer run records around the image, deps and checkpoint pipelines it runs in other
    threads, ending when it has joined them): a wrapper is on the path only where no phase
    inside it is."""
    tops = [s for s in node.spans if not s["parent"] and s["end"] > s["start"]]
    return ([s for s in tops if pipeline_of(s["phase"]) not in WRAPPERS],
            [s for s in tops if pipeline_of(s["phase"]) in WRAPPERS])


def _last_arrival(view: AttemptView) -> tuple[NodeView, dict] | None:
    """The node and span of the rank that entered the first collective (else the
    ``dist.init`` rendezvous) last."""
    for phase in COLLECTIVES:
        best = None
        for n in view.nodes:   # each node's latest start of it, kept without drawing lanes
            start = n.collectives.get(phase)
            if start is not None and (best is None or start > best[1]):
                best = (n, start)
        if best is not None:
            node, start = best
            return node, next(s for s in node.spans if s["phase"] == phase
                              and not s["parent"] and s["start"] == start)
    return None


def _merged(segments: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for s in segments:
        if out and out[-1].phase == s.phase and out[-1].lane == s.lane \
                and out[-1].node == s.node \
                and abs(out[-1].end - s.start) < EPS_S:
            out[-1] = Segment(s.phase, s.lane, out[-1].start, s.end, s.node)
        elif s.seconds > 0:
            out.append(s)
    return out


def shares(path: list[Segment]) -> dict[str, float]:
    """Seconds of the path per pipeline (technique): image, deps, ckpt, job..."""
    out: dict[str, float] = {}
    for s in path:
        key = s.phase if s.phase in (UNTRACED, NOT_STARTED) else pipeline_of(s.phase)
        out[key] = out.get(key, 0.0) + s.seconds
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
