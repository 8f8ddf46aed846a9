"""Report forms: terminal tables and JSON for machines here; the Chrome/Perfetto trace
(export_chrome), the HTML page (export_html), OpenTelemetry spans (export_otlp) and
Prometheus metrics (export_prom) in their own modules."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence

from bootseer.report import export_chrome, export_html
from bootseer.report import sources as src
from bootseer.report.summary import RANK_TABLE_COLUMNS, Summary, job_init_line
from bootseer.report.views import AttemptView


def _f(v) -> str:
    return "-" if v is None else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"


def table(head: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in r] for r in [head, *rows]]
    w = [max(len(r[i]) for r in cells) for i in range(len(head))]
    out = ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in cells]
    out.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(out)


def _path_line(s: Summary) -> list[str]:
    if not s.critical_path:
        return []
    chain, node = [], None
    for x in s.critical_path:
        if x.seconds < 0.005:
            continue
        where = f" @{x.node}" if x.node != node else ""
        node = x.node
        chain.append(f"{x.phase} {_f(x.seconds)}{where}")
    total = s.time_to_ready or sum(x.seconds for x in s.critical_path) or 1.0
    shares = ", ".join(f"{p} {_f(v)} s ({v / total * 100:.0f}%)" for p, v in s.path_shares.items())
    return [f"  critical path: {' -> '.join(chain)}", f"  on the path: {shares}"]


RANK_ROWS_SHOWN = 8


def _latest_ready_first(r: dict) -> float:
    # a rank never ready sorts first: it is the one that held the node back
    ready = r.get("ready")
    return -(ready if ready is not None else float("inf"))


def _ranks(s: Summary) -> list[str]:
    if not s.ranks:
        return []
    cols = [c for c in RANK_TABLE_COLUMNS if any(c in r for r in s.ranks)]
    warm = any("warm" in r for r in s.ranks)
    rows = sorted(s.ranks, key=_latest_ready_first)
    out = []
    init = job_init_line(s.ranks)
    if init:
        out.append(f"  {init}")
    waits = [r["rendezvous_wait"] for r in s.ranks if r.get("rendezvous_wait") is not None]
    if waits:
        worst = max(s.ranks, key=lambda r: r.get("rendezvous_wait") or -1.0)
        out.append(f"  waited at the first collective for the slowest rank: median "
                   f"{_f(statistics.median(waits))} s, max {_f(max(waits))} s "
                   f"(node {worst['node']} rank {worst['rank']})")
    head = "the job's phases per rank" + (
        f" (the {RANK_ROWS_SHOWN} last ready of {len(rows)}; all in --json)"
        if len(rows) > RANK_ROWS_SHOWN else "")
    out.append(head)
    out.append(table(["node", "rank", *[f"{c} s" for c in cols], "rdzv wait s", "ready s",
                      *(["warm"] if warm else [])],
                     [[r["node"], r["rank"], *[_f(r.get(c)) for c in cols],
                       _f(r.get("rendezvous_wait")), _f(r.get("ready")),
                       *([r.get("warm") or "-"] if warm else [])]
                      for r in rows[:RANK_ROWS_SHOWN]]))
    return out


def _roles(roles: dict) -> str:
    return ", ".join(f"{r} {k}" for r, k in roles.items()) or "-"


def sources_table(s: Summary) -> list[str]:
    """Bytes by source: per pipeline, the job's bytes from the origin and from peers."""
    if not s.sources:
        return []
    rows = [[p, src.mib(t["origin"]), src.mib(t["peers"]), src.share_text(t["peer_share"]),
             t["nodes"], _roles(t["roles"])] for p, t in s.sources.items()]
    out = ["bytes by source (all nodes; MiB as stored; -: not traced)",
           table(["pipeline", "origin MiB", "peers MiB", "from peers", "nodes", "peers role"],
                 rows)]
    most = s.sources[src.ALL]["most_origin"]
    if s.sources[src.ALL]["nodes"] > 1:   # a maker, or a node the peers missed
        per = ", ".join(f"{p} {src.mib(r[0])}"
                        for p, r in s.node_sources[most["node"]].items() if r[0])
        out.append(f"  most from the origin: node {most['node']}, {src.mib(most['origin'])} "
                   "MiB" + (f" ({per})" if per else ""))
    return out


def text(summaries: list[Summary], skipped: int = 0, problems: Sequence[str] = ()) -> str:
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
        parts += _path_line(s)
        if s.stragglers:
            parts.append(f"  stragglers (ready > median + {s.k:g}*MAD): {', '.join(s.stragglers)};"
                         f" what-if at the median: {_f(s.what_if)} s")
        else:
            parts.append(f"  no stragglers (rule: median + {s.k:g}*MAD)")
        parts.append(f"  GPU-seconds lost waiting: {s.gpu_seconds_lost:.0f}")
        rows = [[p, _f(v.median), _f(v.p90), _f(v.max), v.n]
                for p, v in sorted(s.phases.items(), key=lambda kv: -kv[1].max)]
        parts.append(table(["phase", "median s", "p90 s", "max s", "nodes"], rows))
        parts += _ranks(s)
        parts += sources_table(s)
        parts.append("")
    if len(summaries) > 1:
        parts.append("attempts side by side (seconds on the critical path to ready)")
        parts.append(side_by_side([(f"attempt {s.attempt}", s) for s in summaries]))
        parts.append("")
    total = sum(s.gpu_seconds_lost for s in summaries)
    parts.append(f"attempts: {len(summaries)} (restarts: {max(len(summaries) - 1, 0)}), "
                 f"GPU-seconds lost in all: {total:.0f}")
    if skipped:
        parts.append(f"skipped {skipped} unreadable line(s) (torn by a crash or garbage)")
    parts += [f"warning: {p}" for p in problems]
    parts += [f"warning: {p}" for s in summaries for p in s.problems]
    return "\n".join(parts)


def side_by_side(columns: list[tuple[str, Summary]]) -> str:
    """What each pipeline held on the critical path, one column per attempt/baseline."""
    names: list[str] = []
    for _, s in columns:
        names += [p for p in s.path_shares if p not in names]
    rows = [[p, *[_f(s.path_shares.get(p)) for _, s in columns]] for p in names]
    rows.append(["TIME TO READY", *[_f(s.time_to_ready) for _, s in columns]])
    rows.append(["gated by", *[f"{s.gating_node or '-'} {s.gating_phase or ''}".strip()
                               for _, s in columns]])
    return table(["pipeline", *[c for c, _ in columns]], rows)


def compare(new: list[Summary], base: list[Summary]) -> str:
    a, b = new[-1], base[-1]
    rows = []
    for p in sorted(set(a.phases) | set(b.phases)):
        x = a.phases[p].max if p in a.phases else None
        y = b.phases[p].max if p in b.phases else None
        red = f"{(1 - x / y) * 100:.0f}%" if x is not None and y else "-"
        rows.append([p, _f(y), _f(x), red])
    x, y = a.time_to_ready, b.time_to_ready
    rows.append(["TIME TO READY", _f(y), _f(x), f"{(1 - x / y) * 100:.0f}%" if x and y else "-"])
    return (table(["phase (max over nodes)", "baseline s", "this s", "reduction"], rows)
            + "\n\ncritical path to ready, against the baseline (seconds per pipeline)\n"
            + side_by_side([(f"baseline {b.attempt}", b), (f"this {a.attempt}", a)])
            + _origin_against(a, b))


def _origin_against(a: Summary, b: Summary) -> str:
    """Bytes from the origin per pipeline, this attempt against the baseline's."""
    names = [p for p in src.PIPELINES if p in a.sources or p in b.sources]
    if not names:
        return ""
    if all(p in a.sources and p in b.sources for p in names):   # else the totals differ in kind
        names.append(src.ALL)
    rows = []
    for p in names:
        x, y = a.sources.get(p, {}).get("origin"), b.sources.get(p, {}).get("origin")
        rows.append([p, src.mib(y), src.mib(x), f"{(1 - x / y) * 100:.0f}%"
                     if x is not None and y else "-"])
    nodes = (b.sources.get(src.ALL, {}).get("nodes", 0), a.sources.get(src.ALL, {}).get("nodes", 0))
    return ("\n\nbytes from the origin, against the baseline (MiB, all nodes: the baseline's "
            f"{nodes[0]}, this one's {nodes[1]})\n"
            + table(["pipeline", "baseline", "this", "reduction"], rows))


JSON_SCHEMA = 1
"""Version of ``report --json``'s document (``{"schema": 1, "attempts": [...]}``), as every
``--json`` of the CLI has one (``cli._flags.JSON_SCHEMA``): raised when a field changes
meaning or goes away."""


def to_json(summaries: list[Summary]) -> str:
    """``{"schema", "attempts"}``, one summary per attempt, one line per field of each:
    readable, and encoded by json's C encoder (an ``indent`` selects its pure-Python one;
    ``dataclasses.asdict`` deep-copies every per-rank row: together most of a 10,000-node
    report's time). Its records (a phase's figures, a step of the path) become objects of
    their fields."""
    out = []
    for s in summaries:
        fields = ",\n ".join(f"{json.dumps(f.name)}: "
                             f"{json.dumps(getattr(s, f.name), default=dataclasses.asdict)}"
                             for f in dataclasses.fields(s))
        out.append("{" + fields + "}")
    return (f'{{"schema": {JSON_SCHEMA}, "attempts": [\n' + ",\n".join(out) + "\n]}\n")


def chrome(views: list[AttemptView], summaries: list[Summary] | None = None) -> str:
    return export_chrome.to_json(views, summaries)


def to_html(views: list[AttemptView], summaries: list[Summary], title: str,
            report_text: str, baseline: list[Summary] | None = None) -> str:
    return export_html.to_html(views, summaries, title, report_text, baseline)
