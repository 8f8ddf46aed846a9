"""Terminal tables for the demo and the e2e benchmark, from ``bootseer run --summary``."""

from __future__ import annotations

import statistics

from bootseer.demo.scenario import NodeResult, explain_failure

PIPELINES = ("image", "deps", "ckpt")


def pipeline_s(r: NodeResult, pipeline: str) -> float | None:
    for name, p in r.summary.get("phases", {}).items():
        if name.split(".")[0] == pipeline:
            return p["end"] - p["start"]
    return None


def to_ready_in_job(r: NodeResult) -> float | None:
    """From the command's start to ready: interpreter, imports, checkpoint load, one step."""
    run = r.summary.get("phases", {}).get("job.run")
    if run is None or r.ready_s is None:
        return None
    return r.ready_s - run["start"]


def columns(results: list[NodeResult]) -> dict[str, float | None]:
    def worst(values):
        values = [v for v in values if v is not None]
        return max(values) if values else None
    row = {p: worst(pipeline_s(r, p) for r in results) for p in PIPELINES}
    row["job"] = worst(to_ready_in_job(r) for r in results)
    readies = [r.ready_s for r in results if r.ready_s is not None]
    row["ready"] = max(readies) if len(readies) == len(results) else None
    row["spread"] = (max(readies) / statistics.median(readies)) if readies else None
    return row


def gating(results: list[NodeResult]) -> str:
    """Which node gated the start and which of its phases took longest."""
    problem = explain_failure(results)
    if problem:
        return problem
    done = [(r, r.ready_s) for r in results if r.ready_s is not None]
    slowest = max(done, key=lambda d: d[1])[0]
    parts = {p: pipeline_s(slowest, p) for p in PIPELINES}
    parts["job"] = to_ready_in_job(slowest)
    known = {k: v for k, v in parts.items() if v is not None}
    phase = max(known, key=lambda k: known[k])
    return f"{slowest.node}, {phase} ({known[phase]:.1f} s)"


def fmt(v: float | None, unit: str = "s") -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if unit == "x" else f"{v:.1f}"


def _windows(events: list[dict], r: NodeResult, phase: str = "image.window") -> list[dict]:
    """The attributes of the node's ``phase`` events of this start: its node, inside the
    run's span."""
    t0 = r.summary.get("t0")
    if t0 is None:
        return []
    end = t0 + max((p["end"] for p in r.summary.get("phases", {}).values()), default=0) + 5
    return [e.get("attrs") or {} for e in events
            if e.get("phase") == phase and e.get("node") == r.node
            and t0 <= e.get("start", 0) <= end]


def _window(events: list[dict], r: NodeResult, phase: str = "image.window") -> dict | None:
    """The node's first ``phase`` event of this start (None: none)."""
    return next(iter(_windows(events, r, phase)), None)


def ckpt_staged_per_read(events: list[dict], results: list[NodeResult]) -> float | None:
    """The most bytes a node of this start brought in per checkpoint byte its ranks read
    (its mount's ``ckpt.load`` report; None where the job read a staged copy instead)."""
    # the node's mount reports it; the job's own ckpt.load phase (its ranks' trace) does not
    found = [v for r in results for attrs in _windows(events, r, "ckpt.load")
             if isinstance(v := attrs.get("staged_per_read"), (int, float))]
    return float(max(found)) if found else None


def hot_set_sources(events: list[dict], results: list[NodeResult]) -> tuple[int, int] | None:
    """(bytes from the origin, bytes from peers) of a start's hot-set prefetch, summed
    over its nodes from their trace (None: nothing was prefetched through the set's
    sources, e.g. a conventional start or a first start that records)."""
    origin = peers = 0
    seen = False
    for r in results:
        attrs = _window(events, r) or {}
        if "prefetch_origin_bytes" in attrs:
            seen = True
            origin += attrs["prefetch_origin_bytes"] or 0
            peers += attrs.get("prefetch_peer_bytes") or 0
    return (origin, peers) if seen else None


def fmt_sources(sources: tuple[int, int] | None) -> str:
    if sources is None:
        return "-"
    return f"{sources[0] / 2**20:.0f} / {sources[1] / 2**20:.0f}"


def render(starts: list[tuple[str, list[NodeResult]]], events: list[dict] | None = None) -> str:
    """One row per start: slowest node per pipeline (they overlap), time to ready, ratio;
    with the trace's ``events``, also where the hot set came from (origin / peers, MiB
    stored, all nodes together)."""
    head = ["start", "image s", "deps s", "ckpt s", "job->ready s", "ready (max) s",
            "vs first", "slowest/median", "gated by"]
    if events is not None:
        head.insert(2, "hot set MiB origin / peers")
        head.insert(5, "ckpt staged/read")
    rows = []
    base = None
    for name, results in starts:
        c = columns(results)
        if base is None:
            base = c["ready"]
        ratio = (c["ready"] / base) if (c["ready"] and base) else None
        row = [name, fmt(c["image"]), fmt(c["deps"]), fmt(c["ckpt"]), fmt(c["job"]),
               fmt(c["ready"]), fmt(ratio, "x"), fmt(c["spread"], "x"), gating(results)]
        if events is not None:
            row.insert(2, fmt_sources(hot_set_sources(events, results)))
            row.insert(5, fmt(ckpt_staged_per_read(events, results), "x"))
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    line = lambda cells: "  ".join(str(c).ljust(w)  # noqa: E731
                                   for c, w in zip(cells, widths, strict=True))
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])
