"""Chrome trace event format (JSON), for ui.perfetto.dev and chrome://tracing.

One process per node and attempt; one thread per lane track (a pipeline of one process of
the node: ``image``, ``deps``, ``ckpt``, ``job rank 0``...) named with ``thread_name``
metadata, its slices nested properly; marks (``ready``, ``rendezvous``, ``image.window``)
as instants on their lane; counters for bytes/s of the phases that report bytes and for
stall seconds; the critical path as its own track. Timestamps are absolute (microseconds
since the epoch, after clock alignment) so that attempts line up on one timeline.
"""

from __future__ import annotations

import json

from bootseer.report.summary import Summary
from bootseer.report.views import AttemptView

PID_STRIDE = 100_000   # pid = attempt * stride + node index + 1 (0 is each attempt's own)
STALL_KEYS = ("stall_s",)
BYTE_KEYS = ("bytes_consumed", "bytes")


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def events(views: list[AttemptView], summaries: list[Summary] | None = None) -> list[dict]:
    out: list[dict] = []
    sums = {s.attempt: s for s in summaries or []}
    for v in views:
        base = v.attempt * PID_STRIDE
        for i, n in enumerate(v.nodes):
            pid = base + i + 1
            out.append({"name": "process_name", "ph": "M", "pid": pid,
                        "args": {"name": f"{n.node} (attempt {v.attempt})"}})
            out.append({"name": "process_sort_index", "ph": "M", "pid": pid,
                        "args": {"sort_index": pid}})
            tids = _threads(out, pid, n)
            _slices(out, pid, tids, n, v.t0)
            for m in n.marks:
                out.append({"name": m["phase"], "ph": "i", "s": "t", "pid": pid,
                            "tid": tids[(m["lane"], 0)] if (m["lane"], 0) in tids
                            else min(tids.values(), default=1),
                            "ts": _us(v.t0 + m["t"]), "args": dict(m["attrs"])})
            _counters(out, pid, n, v.t0)
        s = sums.get(v.attempt)
        if s is not None and s.critical_path:
            out.append({"name": "process_name", "ph": "M", "pid": base,
                        "args": {"name": f"attempt {v.attempt}: critical path"}})
            out.append({"name": "thread_name", "ph": "M", "pid": base, "tid": 1,
                        "args": {"name": "critical path"}})
            for seg in s.critical_path:
                out.append({"name": seg.phase, "ph": "X", "pid": base, "tid": 1,
                            "ts": _us(v.t0 + seg.start),
                            "dur": max(_us(v.t0 + seg.end) - _us(v.t0 + seg.start), 0),
                            "args": {"node": seg.node, "lane": seg.lane}})
    return out


def _threads(out: list[dict], pid: int, n) -> dict[tuple, int]:
    tids: dict[tuple, int] = {}
    tracks = {(s["lane"], s["track"]) for s in n.spans}
    tracks |= {(m["lane"], 0) for m in n.marks}
    order = {lane: i for i, lane in enumerate(n.lanes)}
    for key in sorted(tracks, key=lambda k: (order.get(k[0], len(order)), k[1])):
        tid = len(tids) + 1
        tids[key] = tid
        name = key[0] if key[1] == 0 else f"{key[0]} ({key[1] + 1})"
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                    "args": {"name": name}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                    "args": {"sort_index": tid}})
    return tids


def _slices(out: list[dict], pid: int, tids: dict, n, t0: float) -> None:
    """Complete events per track, parents first; a child is clamped into its parent's
    microseconds so rounding can never make two slices overlap without nesting."""
    by_track: dict[tuple, list[dict]] = {}
    for s in n.spans:
        by_track.setdefault((s["lane"], s["track"]), []).append(s)
    for key, spans in by_track.items():
        open_ends: list[float] = []
        for s in sorted(spans, key=lambda x: (x["start"], -x["end"])):
            ts, end = _us(t0 + s["start"]), _us(t0 + s["end"])
            while open_ends and open_ends[-1] <= ts:
                open_ends.pop()
            if open_ends:
                end = min(end, open_ends[-1])
            args = {k: v for k, v in s["attrs"].items() if isinstance(v, (str, int, float, bool))}
            if s["status"] != "ok":
                args["status"] = s["status"]
            if s["rank"] is not None:
                args["rank"] = s["rank"]
            out.append({"name": s["phase"], "cat": s["lane"].split(" ", 1)[0], "ph": "X",
                        "pid": pid, "tid": tids[key], "ts": ts, "dur": max(end - ts, 0),
                        "args": args})
            open_ends.append(end)


def _counters(out: list[dict], pid: int, n, t0: float) -> None:
    """bytes/s of each phase reporting bytes (a step: the rate while it ran, then 0) and
    stall seconds reported by phases and marks."""
    rates: dict[str, list[tuple[float, float]]] = {}
    for s in n.spans:
        size = next((s["attrs"][k] for k in BYTE_KEYS
                     if isinstance(s["attrs"].get(k), (int, float))), None)
        dur = s["end"] - s["start"]
        if size and dur > 0:
            series = rates.setdefault(s["lane"].split(" ", 1)[0], [])
            series += [(s["start"], size / dur / 1e6), (s["end"], 0.0)]
    for pipeline, series in rates.items():
        for t, value in sorted(series):
            out.append({"name": f"{pipeline} MB/s", "ph": "C", "pid": pid,
                        "ts": _us(t0 + t), "args": {"MB/s": round(value, 3)}})
    stalls = 0.0
    items = [(s["end"], s["attrs"]) for s in n.spans] + [(m["t"], m["attrs"]) for m in n.marks]
    for t, attrs in sorted(items, key=lambda x: x[0]):
        v = attrs.get("stall_s")
        if isinstance(v, (int, float)) and v > 0:
            stalls += v
            out.append({"name": "stalls (s, cumulative)", "ph": "C", "pid": pid,
                        "ts": _us(t0 + t), "args": {"stall s": round(stalls, 3)}})


def to_json(views: list[AttemptView], summaries: list[Summary] | None = None) -> str:
    return json.dumps({"traceEvents": events(views, summaries), "displayTimeUnit": "ms"})
