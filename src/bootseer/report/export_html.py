"""The HTML report: one self-contained page (no network) a person reads in a minute.

Per attempt: the time to ready, gating node and phase, the critical path on the swim lanes'
time axis, swim lanes (a row per pipeline track per node; the gating node first and
highlighted, its gating phase outlined; marks as triangles, ready as a line; tooltips), the
job's phases per rank with the rendezvous wait, technique figures, bytes by source (origin
and peers per pipeline: the job's, and the lanes' nodes', also in their rows' tooltips),
CDFs across nodes with axes and a legend. On top, the attempts (and the baseline) side by
side: what each pipeline held on the critical path. Tables are plain HTML; the charts are
drawn with uPlot (a small MIT charting library, vendored in ``vendor/`` and embedded in the
page, so it works offline) by the page's script (``export_html.js``) from the embedded
JSON. The script sets ``data-rendered="1"`` on ``<body>`` when every chart has drawn, and on
each chart's container ``data-geometry``: the rows and rectangles it drew (browser tests
read them).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from bootseer.report import sources as src
from bootseer.report.critical_path import NOT_STARTED
from bootseer.report.summary import RANK_TABLE_COLUMNS, Summary, job_init_line
from bootseer.report.views import AttemptView, pipeline_of

VENDOR = Path(__file__).with_name("vendor")
UPLOT_VERSION = "1.6.32"   # vendor/README.md says how to update it
MAX_LANE_NODES = 24        # swim lanes for the slowest nodes (a 10,000-row chart helps no one)
MAX_RANK_ROWS = 32
CDF_POINTS = 200
# a hue per pipeline (saturation 0: grey): its phases are shades of it, the pipeline bars
# of the attempts' comparison its middle shade, so a lane's colours say which technique
PIPELINE_HUES = {"startup": (0, 0), "image": (210, 70), "deps": (28, 85), "ckpt": (130, 55),
                 "job": (275, 50), "container": (15, 45)}

STYLE = """
body{font-family:system-ui,sans-serif;margin:18px;color:#222}
h1{font-size:20px}h2{font-size:17px;margin-top:28px;border-top:1px solid #ddd;padding-top:10px}
h3{font-size:14px;margin:14px 0 4px}
table{border-collapse:collapse;font-size:12px;margin:4px 0}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
.cards{display:flex;gap:10px;flex-wrap:wrap}
.card{border:1px solid #ddd;border-radius:6px;padding:6px 10px;min-width:150px}
.card b{display:block;font-size:18px}.card.hot{border-color:#d62728;background:#fff5f5}
.key{display:inline-block;margin:2px 8px 2px 0;font-size:12px}
.key i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.uplot .u-legend{font-size:12px;text-align:left}.uplot .u-legend .u-series>*{padding:1px 4px}
#tip{position:absolute;display:none;background:#fff;border:1px solid #888;padding:4px 6px;
font-size:12px;pointer-events:none;box-shadow:0 1px 4px #0003;max-width:420px}
pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto}
.note{color:#666;font-size:12px}
"""


FIXED = {"(untraced)": "#d9d9d9", NOT_STARTED: "#efefef"}


def _family_hue(pipeline: str) -> tuple[float, int]:
    if pipeline in PIPELINE_HUES:
        return PIPELINE_HUES[pipeline]
    # other pipelines: hues between the known ones, stable per name
    return (sum(map(ord, pipeline)) * 137.508) % 360, 60


def pipeline_colors(pipelines) -> dict[str, str]:
    out = {p: FIXED[p] for p in pipelines if p in FIXED}
    for p in pipelines:
        if p not in FIXED:
            hue, sat = _family_hue(p)
            out[p] = f"hsl({hue:.0f},{sat}%,45%)"
    return out


def phase_colors(names) -> dict[str, str]:
    """A distinct colour per phase, however many, in its pipeline's hue (image phases
    blue, deps orange, ckpt green, job purple...): shades from dark to light, the hue
    swinging a little from one to the next so neighbours differ; the same phase gets the
    same colour in every chart of the page."""
    out = {n: FIXED[n] for n in names if n in FIXED}
    families: dict[str, list[str]] = {}
    for n in sorted(x for x in names if x not in FIXED):
        families.setdefault(pipeline_of(n), []).append(n)
    for pipeline, members in families.items():
        hue, sat = _family_hue(pipeline)
        for i, name in enumerate(members):
            light = 30 + 45 * i / (len(members) - 1) if len(members) > 1 else 45
            swing = ((i % 3) - 1) * 14 if sat else 0
            out[name] = f"hsl({(hue + swing) % 360:.0f},{sat}%,{light:.1f}%)"
    return out


def _f(v) -> str:
    return "-" if v is None else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"


def _extra(attrs: dict) -> str:
    items = [f"{k}={v}" for k, v in attrs.items()
             if isinstance(v, (int, float, str)) and k != "error"][:6]
    if "error" in attrs:
        items.append(f"error={str(attrs['error'])[:120]}")
    return ", ".join(items)


def _quantiles(values: list[float]) -> list[float]:
    s = sorted(values)
    if len(s) <= CDF_POINTS:
        return [round(x, 4) for x in s]
    return [round(s[int(i * (len(s) - 1) / (CDF_POINTS - 1))], 4) for i in range(CDF_POINTS)]


def _shown_nodes(v: AttemptView, s: Summary) -> list:
    def key(n):
        return (n.node != s.gating_node, n.ready is not None, -(n.ready or 0.0), n.node)
    return sorted(v.nodes, key=key)[:MAX_LANE_NODES]


def _attempt_data(v: AttemptView, s: Summary) -> dict:
    shown = _shown_nodes(v, s)
    readies = [n.ready for n in v.nodes if n.ready is not None]
    ready_end = max(readies + [x.end for x in s.critical_path], default=0.0)
    end = ready_end * 1.06 if ready_end else max(
        [x["end"] for n in shown for x in n.spans] + [1e-3])
    nodes = []
    for n in shown:
        lane_idx = {lane: i for i, lane in enumerate(n.lanes)}
        tracks: dict[str, int] = {}
        for x in n.spans:
            tracks[x["lane"]] = max(tracks.get(x["lane"], 0), x["track"] + 1)
        gate = None
        if n.node == s.gating_node:
            cands = [x for x in n.spans if x["phase"] == s.gating_phase and not x["parent"]]
            gate = max(cands, key=lambda x: x["end"] - x["start"], default=None)
        spans = [[lane_idx[x["lane"]], x["track"], x["depth"], x["phase"], round(x["start"], 4),
                  round(min(x["end"], end), 4), x["status"], _extra(x["attrs"]), x is gate]
                 for x in n.spans if x["start"] < end]
        marks = [[lane_idx.get(m["lane"], 0), m["phase"], round(m["t"], 4), _extra(m["attrs"])]
                 for m in n.marks if m["t"] <= end]
        nodes.append({"node": n.node, "ready": n.ready, "gating": n.node == s.gating_node,
                      "straggler": n.node in s.stragglers, "spans": spans, "marks": marks,
                      "sources": _node_sources_tip(s.node_sources.get(n.node)),
                      "lanes": [{"label": lane, "tracks": max(tracks.get(lane, 0), 1)}
                                for lane in n.lanes]})
    cdf = {"time to ready": _quantiles(readies)} if readies else {}
    for p in sorted(s.phases):
        cdf[p] = _quantiles([n.phases[p] for n in v.nodes if p in n.phases])
    return {"attempt": v.attempt, "ttr": s.time_to_ready, "end": end,
            "gating_node": s.gating_node, "gating_phase": s.gating_phase,
            "path": [{"phase": x.phase, "node": x.node, "lane": x.lane,
                      "start": round(x.start, 4), "end": round(x.end, 4)}
                     for x in s.critical_path],
            "shares": {k: round(x, 4) for k, x in s.path_shares.items()},
            "nodes": nodes, "cdf": cdf}


def _table(head: list[str], rows: list[list]) -> str:
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                      for r in rows) + "</table>")


def _cards(s: Summary) -> str:
    cards = [("time to ready", f"{_f(s.time_to_ready)} s" if s.time_to_ready is not None
              else "NOT READY", s.time_to_ready is None),
             ("gated by", f"{s.gating_node or '-'}", False),
             ("gating phase", s.gating_phase or "-", True),
             ("stragglers", str(len(s.stragglers)), bool(s.stragglers)),
             ("what-if without stragglers", f"{_f(s.what_if)} s", False),
             ("GPU-seconds lost", f"{s.gpu_seconds_lost:.0f}", False)]
    return '<div class="cards">' + "".join(
        f'<div class="card{" hot" if hot else ""}">{html.escape(k)}<b>{html.escape(v)}</b></div>'
        for k, v, hot in cards) + "</div>"


def _rank_table(s: Summary) -> str:
    if not s.ranks:
        return '<p class="note">no per-rank phases in this trace (no auto-capture)</p>'
    cols = [c for c in RANK_TABLE_COLUMNS if any(c in r for r in s.ranks)]
    warm = any("warm" in r for r in s.ranks)
    rows = sorted(s.ranks, key=lambda r: -(r.get("ready") or float("inf")))
    note = (f'<p class="note">the {MAX_RANK_ROWS} last-ready of {len(rows)} ranks</p>'
            if len(rows) > MAX_RANK_ROWS else "")
    init = job_init_line(s.ranks)
    if init:
        note = f'<p class="note">{html.escape(init)}</p>' + note
    return note + _table(["node", "rank", *[f"{c} s" for c in cols], "waited at rendezvous s",
                          "ready at s", *(["warm"] if warm else [])],
                         [[r["node"], r["rank"], *[_f(r.get(c)) for c in cols],
                           _f(r.get("rendezvous_wait")), _f(r.get("ready")),
                           *([r.get("warm") or "-"] if warm else [])]
                          for r in rows[:MAX_RANK_ROWS]])


def _figures_table(s: Summary) -> str:
    if not s.figures:
        return '<p class="note">no technique figures in this trace</p>'
    rows = []
    for tech, figs in s.figures.items():
        for k, v in figs.items():
            if k == "nodes":
                continue
            shown = f"{v * 100:.1f} %" if k in ("coverage", "precision") else (
                f"{v / 1e6:.1f} MB" if k.endswith("bytes") else _f(v))
            rows.append([tech, k, shown, figs.get("nodes", "-")])
    return _table(["technique", "figure (median over nodes)", "value", "nodes"], rows)


def _node_sources_tip(per: dict | None) -> str:
    """A node's bytes by source, for the tooltip of its row in the swim lanes."""
    if not per:
        return ""
    return "; ".join(f"{p}: {src.mib(o)} MiB origin, {src.mib(x)} MiB peers"
                     + (f" ({role})" if role else "") for p, (o, x, role) in per.items())


def _sources_section(s: Summary, shown: list[str]) -> str:
    """Bytes by source: the job's per pipeline, then the nodes drawn in the swim lanes."""
    if not s.sources:
        return ('<p class="note">no bytes by source in this trace (the image window, '
                'restores and checkpoint loads recorded no byte counts)</p>')
    totals = _table(["pipeline", "origin MiB", "peers MiB", "from peers", "nodes",
                     "peers role (nodes)"],
                    [[p, src.mib(t["origin"]), src.mib(t["peers"]),
                      src.share_text(t["peer_share"]), t["nodes"],
                      ", ".join(f"{r} {k}" for r, k in t["roles"].items()) or "-"]
                     for p, t in s.sources.items()])
    pipelines = [p for p in src.PIPELINES if p in s.sources]
    per_node = s.node_sources
    # the swim lanes' nodes, then the one that took the most from the origin
    names = [n for n in shown if n in per_node]
    heaviest = s.sources[src.ALL]["most_origin"]["node"]
    if heaviest not in names:
        names.append(heaviest)
    rows = []
    for n in names:
        per = per_node[n]
        origin = sum(r[0] or 0 for r in per.values())
        peers = [r[1] for r in per.values() if r[1] is not None]
        rows.append([n + (" (most from the origin)" if n == heaviest and len(per_node) > 1
                          else ""),
                     *[x for p in pipelines for x in
                       ((src.mib(per[p][0]), src.mib(per[p][1])) if p in per else ("", ""))],
                     src.share_text(src.peer_share(origin, sum(peers) if peers else None)),
                     ", ".join(sorted({r[2] for r in per.values() if r[2]})) or "-"])
    note = (f'<p class="note">per node: the {len(names)} nodes drawn above of the '
            f'{len(per_node)} that traced bytes (all of them in --json)</p>'
            if len(per_node) > len(names) else "")
    return totals + note + _table(
        ["node", *[f"{p} {k} MiB" for p in pipelines for k in ("origin", "peers")],
         "from peers", "peers role"], rows)


def _path_table(s: Summary) -> str:
    if not s.critical_path:
        return '<p class="note">no node got ready: no critical path</p>'
    return _table(["phase", "node", "lane", "from s", "to s", "seconds", "share"],
                  [[x.phase, x.node, x.lane, _f(x.start), _f(x.end),
                    _f(x.seconds), f"{100 * x.seconds / (s.time_to_ready or 1):.0f} %"]
                   for x in s.critical_path])


def to_html(views: list[AttemptView], summaries: list[Summary], title: str, report_text: str,
            baseline: list[Summary] | None = None) -> str:
    attempts = [_attempt_data(v, s) for v, s in zip(views, summaries, strict=True)]
    names = {x[3] for a in attempts for n in a["nodes"] for x in n["spans"]}
    names |= {x["phase"] for a in attempts for x in a["path"]}
    names |= {p for a in attempts for p in a["cdf"] if p != "time to ready"}
    pipelines = {p for s in [*summaries, *(baseline or [])] for p in s.path_shares}
    data = {"colors": phase_colors(names), "pipeline_colors": pipeline_colors(pipelines),
            "attempts": attempts,
            "baseline": [{"attempt": b.attempt, "ttr": b.time_to_ready, "shares": b.path_shares}
                         for b in baseline] if baseline else None}
    body = [f"<h1>{html.escape(title)}</h1>",
            "<h2>attempts side by side: the critical path to ready, by pipeline</h2>",
            '<div id="compare"></div><div id="legend-pipelines"></div>',
            _table(["attempt", "time to ready s", "gated by", "gating phase", "stragglers",
                    "GPU-s lost"],
                   [*[[f"baseline {b.attempt}", _f(b.time_to_ready), b.gating_node or "-",
                       b.gating_phase or "-", len(b.stragglers), f"{b.gpu_seconds_lost:.0f}"]
                      for b in baseline or []],
                    *[[s.attempt, _f(s.time_to_ready), s.gating_node or "-",
                       s.gating_phase or "-", len(s.stragglers), f"{s.gpu_seconds_lost:.0f}"]
                      for s in summaries]]),
            "<h3>phase colours</h3><div id='legend-phases'></div>"]
    for v, s, a in zip(views, summaries, attempts, strict=True):
        shown = len(a["nodes"])
        body += [f"<h2 id='attempt-{v.attempt}'>attempt {v.attempt}</h2>", _cards(s),
                 f"<p class='note'>{s.nodes} nodes; clocks aligned by {html.escape(s.alignment)}"
                 + (f"; NOT READY: {html.escape(', '.join(s.not_ready[:10]))}" if s.not_ready
                    else "") + "</p>",
                 "<h3>critical path (what the time to ready waited on)</h3>",
                 f"<div id='path-{v.attempt}'></div>",
                 "<h3>swim lanes: one row per pipeline per node"
                 + (f" (the gating node and the {shown - 1} slowest of {s.nodes} nodes)"
                    if s.nodes > shown else "") + "; triangles: marks, black line: ready, "
                 "thick black outline: the gating phase</h3>",
                 f"<div id='lanes-{v.attempt}' class='lanes'></div>",
                 _path_table(s),
                 "<h3>the job's phases per rank (rendezvous wait: time a rank waited at the "
                 "first collective for the last to arrive)</h3>", _rank_table(s),
                 "<h3>technique figures</h3>", _figures_table(s),
                 f"<h3 id='sources-{v.attempt}'>bytes by source: from the origin and from "
                 "the job's peers (MiB as stored; -: not traced)</h3>",
                 _sources_section(s, [n["node"] for n in a["nodes"]]),
                 "<h3>CDF across nodes: time to ready and each phase</h3>",
                 f"<div id='cdf-{v.attempt}'></div>"]
    body.append(f"<h2>text report</h2><pre>{html.escape(report_text)}</pre>")
    script = (Path(__file__).with_name("export_html.js")).read_text()
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<meta name='generator' content='bootseer report; uPlot {UPLOT_VERSION}'><title>"
            f"{html.escape(title)}</title><style>{_vendored('uPlot.min.css')}</style>"
            f"<style>{STYLE}</style></head><body>"
            + "\n".join(body) + "<div id='tip'></div>"
            f"<script type='application/json' id='report-data'>{payload}</script>"
            f"<script>{_vendored('uPlot.iife.min.js')}</script>"
            f"<script>{script}</script></body></html>")


def _vendored(name: str) -> str:
    """A vendored file's text, to embed in a <script> or <style> element."""
    text = (VENDOR / name).read_text()
    if "</" in text:   # it would end the element early: an update of vendor/ to look at
        raise ValueError(f"report/vendor/{name} holds '</': it cannot be embedded as it is")
    return text
