"""Report forms: terminal tables, JSON for machines, Chrome/Perfetto trace JSON, and a
self-contained HTML page (inline SVG; opens offline)."""

from __future__ import annotations

import dataclasses
import html
import json

from bootseer.trace.analysis import AttemptView, Summary

PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac"]


def _f(v) -> str:
    return "-" if v is None else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"


def table(head: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in r] for r in [head, *rows]]
    w = [max(len(r[i]) for r in cells) for i in range(len(head))]
    out = ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in cells]
    out.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(out)


def text(summaries: list[Summary], skipped: int = 0, problems: list[str] = ()) -> str:
    parts = []
    for s in summaries:
        parts.append(f"attempt {s.attempt}: {s.nodes} nodes, time to ready "
                     f"{_f(s.time_to_ready)} s (max over nodes; clocks aligned by {s.alignment})")
        if s.not_ready:
            parts.append(f"  NOT READY: {', '.join(s.not_ready)} (killed or failed before ready;"
                         f" time to ready undefined)")
        if s.gating_node:
            rank = "" if s.gating_rank is None else f" (rank {s.gating_rank} last)"
            parts.append(f"  gated by node {s.gating_node}{rank}, phase {s.gating_phase}")
        if s.stragglers:
            parts.append(f"  stragglers (ready > median + {s.k:g}*MAD): {', '.join(s.stragglers)};"
                         f" what-if at the median: {_f(s.what_if)} s")
        else:
            parts.append(f"  no stragglers (rule: median + {s.k:g}*MAD)")
        parts.append(f"  GPU-seconds lost waiting: {s.gpu_seconds_lost:.0f}")
        rows = [[p, _f(v["median"]), _f(v["p90"]), _f(v["max"]), v["n"]]
                for p, v in sorted(s.phases.items(), key=lambda kv: -kv[1]["max"])]
        parts.append(table(["phase", "median s", "p90 s", "max s", "nodes"], rows))
        parts.append("")
    total = sum(s.gpu_seconds_lost for s in summaries)
    parts.append(f"attempts: {len(summaries)} (restarts: {max(len(summaries) - 1, 0)}), "
                 f"GPU-seconds lost in all: {total:.0f}")
    if skipped:
        parts.append(f"skipped {skipped} unreadable line(s) (torn by a crash or garbage)")
    parts += [f"warning: {p}" for p in problems]
    return "\n".join(parts)


def compare(new: list[Summary], base: list[Summary]) -> str:
    a, b = new[-1], base[-1]
    rows = []
    for p in sorted(set(a.phases) | set(b.phases)):
        x = a.phases.get(p, {}).get("max")
        y = b.phases.get(p, {}).get("max")
        red = f"{(1 - x / y) * 100:.0f}%" if x is not None and y else "-"
        rows.append([p, _f(y), _f(x), red])
    x, y = a.time_to_ready, b.time_to_ready
    rows.append(["TIME TO READY", _f(y), _f(x), f"{(1 - x / y) * 100:.0f}%" if x and y else "-"])
    return table(["phase (max over nodes)", "baseline s", "this s", "reduction"], rows)


def to_json(summaries: list[Summary]) -> str:
    return json.dumps([dataclasses.asdict(s) for s in summaries], indent=1)


def chrome(views: list[AttemptView]) -> str:
    """Chrome trace event format (chrome://tracing, ui.perfetto.dev): a process per node."""
    out = []
    for v in views:
        for i, n in enumerate(v.nodes):
            pid = v.attempt * 100000 + i
            out.append({"name": "process_name", "ph": "M", "pid": pid,
                        "args": {"name": f"attempt {v.attempt} {n.node}"}})
            for s in n.spans:
                out.append({"name": s["phase"], "ph": "X", "pid": pid, "tid": s.get("pid") or 0,
                            "ts": s["start"] * 1e6, "dur": (s["end"] - s["start"]) * 1e6,
                            "args": {**s["attrs"], "status": s["status"]}})
            if n.ready is not None:
                out.append({"name": "ready", "ph": "i", "s": "p", "pid": pid, "tid": 0,
                            "ts": n.ready * 1e6})
    return json.dumps({"traceEvents": out, "displayTimeUnit": "ms"})


def _colors(names):
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(sorted(names))}


GANTT_MAX_NODES = 200


def _gantt(v: AttemptView, colors) -> str:
    W, row = 900, 18
    end = max([s["end"] for n in v.nodes for s in n.spans] + [n.ready or 0 for n in v.nodes] + [1e-6])
    nodes = v.nodes
    if len(nodes) > GANTT_MAX_NODES:  # a 10,000-row chart helps no one: the slowest nodes
        nodes = sorted(nodes, key=lambda n: -(n.ready if n.ready is not None else float("inf")))
        nodes = nodes[:GANTT_MAX_NODES]
    h = row * len(nodes) + 30
    sx = lambda t: 120 + (W - 130) * t / end  # noqa: E731
    g = [f'<svg width="{W}" height="{h}" xmlns="http://www.w3.org/2000/svg" font-size="11">']
    for i, n in enumerate(nodes):
        y = 5 + i * row
        g.append(f'<text x="2" y="{y + 12}">{html.escape(n.node)}</text>')
        for s in n.spans:
            if s["parent"]:
                continue
            x0, x1 = sx(s["start"]), sx(s["end"])
            g.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="{row - 4}" '
                     f'fill="{colors[s["phase"]]}"><title>{html.escape(s["phase"])}: '
                     f'{s["end"] - s["start"]:.2f}s</title></rect>')
        if n.ready is not None:
            g.append(f'<line x1="{sx(n.ready):.1f}" x2="{sx(n.ready):.1f}" y1="{y}" y2="{y + row - 4}" '
                     f'stroke="black" stroke-width="2"/>')
    g.append(f'<text x="120" y="{h - 5}">0 s</text><text x="{W - 60}" y="{h - 5}">{end:.1f} s</text>')
    g.append("</svg>")
    return "".join(g)


def _stacked(s: Summary, colors) -> str:
    W = 900
    total = sum(v["median"] for v in s.phases.values()) or 1e-6
    x = 0.0
    g = [f'<svg width="{W}" height="40" xmlns="http://www.w3.org/2000/svg" font-size="11">']
    for p, v in sorted(s.phases.items()):
        w = (W - 10) * v["median"] / total
        g.append(f'<rect x="{x:.1f}" y="5" width="{w:.1f}" height="20" fill="{colors[p]}">'
                 f'<title>{html.escape(p)}: median {v["median"]:.2f}s</title></rect>')
        x += w
    g.append("</svg>")
    return "".join(g)


def _cdf(v: AttemptView, colors) -> str:
    W, H = 900, 220
    names = sorted({p for n in v.nodes for p in n.phases})
    end = max([n.phases[p] for n in v.nodes for p in n.phases] + [1e-6])
    g = [f'<svg width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg" font-size="11">',
         f'<rect x="40" y="10" width="{W - 50}" height="{H - 40}" fill="none" stroke="#999"/>']
    for p in names:
        vals = sorted(n.phases[p] for n in v.nodes if p in n.phases)
        pts = " ".join(f"{40 + (W - 50) * x / end:.1f},{10 + (H - 40) * (1 - (i + 1) / len(vals)):.1f}"
                       for i, x in enumerate(vals))
        g.append(f'<polyline points="{pts}" fill="none" stroke="{colors[p]}" stroke-width="2">'
                 f'<title>{html.escape(p)}</title></polyline>')
    g.append(f'<text x="40" y="{H - 12}">0 s</text><text x="{W - 60}" y="{H - 12}">{end:.1f} s</text>')
    g.append("</svg>")
    return "".join(g)


def to_html(views: list[AttemptView], summaries: list[Summary], title: str,
            report_text: str) -> str:
    names = {p for v in views for n in v.nodes for p in n.phases}
    colors = _colors(names)
    legend = " ".join(f'<span style="background:{c};padding:2px 6px;margin:2px;color:white">'
                      f'{html.escape(n)}</span>' for n, c in sorted(colors.items()))
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{legend}</p>",
            f"<pre>{html.escape(report_text)}</pre>"]
    for v, s in zip(views, summaries):
        body += [f"<h2>attempt {v.attempt}: time to ready {_f(s.time_to_ready)} s</h2>",
                 "<h3>per-node Gantt chart (black bar: ready)"
                 + (f"; the {GANTT_MAX_NODES} slowest of {len(v.nodes)} nodes"
                    if len(v.nodes) > GANTT_MAX_NODES else "") + "</h3>", _gantt(v, colors),
                 "<h3>phase breakdown (medians, stacked)</h3>", _stacked(s, colors),
                 "<h3>per-phase CDF across nodes</h3>", _cdf(v, colors)]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(title)}</title><style>body{{font-family:sans-serif;margin:20px}}"
            "pre{background:#f6f6f6;padding:8px}</style></head><body>"
            + "\n".join(body) + "</body></html>")
