"""Characterize a cluster from many jobs: share of GPU time lost to startup (per hour of the
day and in all), startup against job size (box plot over GPU bins), phase shares, restarts.

Input: a simulator's ``cluster.jsonl`` (one line per job attempt), or a directory of real
job traces (``<dir>/<job>/<attempt>/*.jsonl``) which are summarized into the same records.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from bootseer import redact
from bootseer.errors import TraceError
from bootseer.report import load, remote
from bootseer.report.render import table
from bootseer.report.simulate import BIN_NAMES, bin_of
from bootseer.report.summary import summarize
from bootseer.report.views import attempts
from bootseer.store import open_store


def read_attempts(path: str | Path) -> tuple[list[dict], list[str]]:
    """Attempt records from a compact file, or summarized from a traces directory or from
    the traces uploaded to a store (``bootseer run --trace URL``)."""
    notes: list[str] = []
    if "://" in str(path):
        return _from_store(str(path), notes), notes
    p = Path(path)
    if not p.exists():
        raise TraceError(f"no cluster trace at {p}: give a simulator output directory "
                         f"(cluster.jsonl) or a directory of job traces")
    compact = p / "cluster.jsonl" if p.is_dir() else p
    if compact.is_file():
        fd = load.open_regular(compact, follow=compact == p)
        if fd is None:
            raise TraceError(f"{compact} is not a regular file")
        lines, bad = load.read_lines(fd)
        recs = []
        for raw in lines:
            try:
                d = json.loads(raw, parse_constant=load.reject_constant)
                if d.get("kind") == "attempt" and all(
                        math.isfinite(v) for v in d.values() if type(v) in (int, float)):
                    recs.append(d)
                elif d.get("kind") == "attempt":
                    bad += 1
            except (ValueError, AttributeError, OverflowError):
                bad += 1
        if bad:
            notes.append(f"skipped {bad} unreadable line(s) in {compact.name}")
        if not recs:
            raise TraceError(f"{compact} holds no job attempts")
        return recs, notes
    return _from_traces(p, notes), notes


def _from_store(url: str, notes: list[str]) -> list[dict]:
    """Every job's traces under the store's ``traces/`` refs, summarized."""
    import tempfile
    local = url[len("file://"):] if url.startswith("file://") else None
    if local is not None and not (Path(local) / "refs").is_dir():   # opening would create it
        raise TraceError(f"no store at {url}")
    with tempfile.TemporaryDirectory(prefix="bootseer-analyze-") as tmp:
        store = open_store(url)
        try:
            parts = remote.jobs(store)
            if not parts:
                raise TraceError(f"{redact.url(url)} holds no traces (refs traces/<job>/...)")
            for part in parts:
                remote.download(store, url, part, str(Path(tmp) / part))
        finally:
            store.close()
        return _from_traces(Path(tmp), notes)


def _from_traces(p: Path, notes: list[str]) -> list[dict]:
    t = load.load(p)
    if t.skipped_lines:
        notes.append(f"skipped {t.skipped_lines} unreadable line(s)")
    notes += t.problems
    by_job: dict[str, list[dict]] = {}
    for e in t.events:
        by_job.setdefault(str(e["job"]), []).append(e)
    recs = []
    for job, evs in sorted(by_job.items()):
        for v in attempts(evs):
            s = summarize(v)
            if s.time_to_ready is None:
                notes.append(f"{job} attempt {v.attempt}: nodes never ready "
                             f"({', '.join(s.not_ready[:3])}); counted until their last event")
            ends = [e["end"] for e in evs if int(e["attempt"]) == v.attempt
                    and e.get("kind") == "mark" and e["phase"] == "train.end"]
            wait = s.gpu_seconds_lost / max(sum(n.gpus for n in v.nodes), 1)
            recs.append({"job": job, "attempt": v.attempt, "gpus": sum(n.gpus for n in v.nodes),
                         "nodes": s.nodes, "t": v.t0, "ready": wait,
                         "train": (max(ends) - v.t0 - wait) if ends else 0.0,
                         "phases": {k: [x.median, x.max] for k, x in s.phases.items()},
                         "gating_node": s.gating_node, "gating_phase": s.gating_phase})
    if not any(r["train"] for r in recs):
        notes.append("no train.end marks: training time unknown, GPU-time share not computed")
    return recs


def characterize(recs: list[dict], day_s: float = 86400.0) -> dict:
    """Cluster figures from attempt records (plain lists and sorting: fast at 30k jobs)."""
    bins: list[list[float]] = [[] for _ in BIN_NAMES]
    lost = train = 0.0
    phase_gpu: dict[str, float] = {}
    gating: dict[str, int] = {}
    attempts_per_job: dict[str, int] = {}
    hours = int(day_s // 3600) or 1
    hourly_start = [0.0] * hours
    hourly_train = [0.0] * hours
    for r in recs:
        g, ready, tr = r["gpus"], r["ready"], r["train"]
        bins[bin_of(g)].append(ready)
        lost += g * ready
        train += g * tr
        tot = sum(v[0] for v in r["phases"].values()) or 1.0
        for k, v in r["phases"].items():  # split the attempt's wait by median phase shares
            phase_gpu[k] = phase_gpu.get(k, 0.0) + g * ready * v[0] / tot
        if r.get("gating_phase"):
            gating[r["gating_phase"]] = gating.get(r["gating_phase"], 0) + 1
        attempts_per_job[r["job"]] = attempts_per_job.get(r["job"], 0) + 1
        t0 = r["t"] % day_s if day_s else 0.0
        _spread(hourly_start, t0, ready, g)
        _spread(hourly_train, t0 + ready, tr, g)
    box = []
    for name, vals in zip(BIN_NAMES, bins, strict=True):
        vals.sort()
        box.append({"bin": name, "n": len(vals), **({} if not vals else {
            "min": vals[0], "q1": _q(vals, .25), "median": _q(vals, .5), "q3": _q(vals, .75),
            "p90": _q(vals, .9), "max": vals[-1]})})
    restarts = [n - 1 for n in attempts_per_job.values()]
    total_phase = sum(phase_gpu.values()) or 1.0
    return {"jobs": len(attempts_per_job), "attempts": len(recs),
            "startup_gpu_h": lost / 3600, "train_gpu_h": train / 3600,
            "lost_share": lost / (lost + train) if train else None,
            "bins": box,
            "phase_shares": {k: v / total_phase
                             for k, v in sorted(phase_gpu.items(), key=lambda kv: -kv[1])},
            "gating_phases": dict(sorted(gating.items(), key=lambda kv: -kv[1])),
            "restarts": {"total": sum(restarts),
                         "mean": statistics.fmean(restarts) if restarts else 0,
                         "max": max(restarts, default=0),
                         "jobs_with_restarts": sum(1 for x in restarts if x)},
            "hourly": [{"hour": h, "startup_gpu_h": s / 3600, "train_gpu_h": t / 3600}
                       for h, (s, t) in enumerate(zip(hourly_start, hourly_train, strict=True))]}


def _spread(buckets: list[float], start: float, dur: float, gpus: int) -> None:
    """Add gpus*dur GPU-seconds over the hour buckets [start, start+dur) (wrapping the day)."""
    n = len(buckets)
    t, left = start, dur
    while left > 1e-9:
        h = int(t // 3600) % n
        step = min(left, 3600 - (t % 3600))
        buckets[h] += gpus * step
        t += step
        left -= step
        if left > n * 3600:  # longer than the whole window: fill evenly and stop
            for i in range(n):
                buckets[i] += gpus * left / n
            break


def _q(s: list[float], q: float) -> float:
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def text(c: dict, notes: Sequence[str] = ()) -> str:
    out = [f"{c['jobs']} jobs, {c['attempts']} attempts; startup {c['startup_gpu_h']:.0f} GPU-h,"
           f" training {c['train_gpu_h']:.0f} GPU-h"]
    if c["lost_share"] is not None:
        out.append(f"share of cluster GPU time lost to startup: {c['lost_share'] * 100:.2f}%")
    out.append("")
    out.append(table(["GPUs", "attempts", "min s", "q1 s", "median s", "q3 s", "p90 s", "max s"],
                     [[b["bin"], b["n"], *[f"{b[k]:.0f}" if k in b else "-"
                                           for k in ("min", "q1", "median", "q3", "p90", "max")]]
                      for b in c["bins"]]))
    out.append("")
    out.append(table(["phase", "share of startup GPU time", "gated attempts"],
                     [[k, f"{v * 100:.1f}%", c["gating_phases"].get(k, 0)]
                      for k, v in c["phase_shares"].items()]))
    r = c["restarts"]
    out.append(f"\nrestarts: {r['total']} in all, {r['mean']:.2f} per job, max {r['max']}, "
               f"{r['jobs_with_restarts']} job(s) restarted")
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def compare(new: dict, base: dict) -> str:
    rows = []
    # both from characterize: a row per size bin, the same bins in the same order
    for a, b in zip(new["bins"], base["bins"], strict=True):
        if "median" in a and "median" in b:
            rows.append([a["bin"], f"{b['median']:.0f}", f"{a['median']:.0f}",
                         f"{(1 - a['median'] / b['median']) * 100:.0f}%" if b["median"] else "-"])
    x, y = new["lost_share"], base["lost_share"]
    if x is not None and y is not None:
        rows.append(["GPU time lost", f"{y * 100:.2f}%", f"{x * 100:.2f}%",
                     f"{(1 - x / y) * 100:.0f}%" if y else "-"])
    return table(["median startup by GPUs", "baseline", "this", "reduction"], rows)


def to_html(c: dict, title: str, report_text: str) -> str:
    import html
    W, H = 900, 260
    bins = [b for b in c["bins"] if b["n"]]
    top = max([b["p90"] for b in bins] + [1.0])
    y = lambda v: 10 + (H - 40) * (1 - min(v, top) / top)  # noqa: E731
    g = [f'<svg width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg" font-size="11">']
    step = (W - 60) / max(len(bins), 1)
    for i, b in enumerate(bins):
        x = 50 + i * step + step / 4
        w = step / 2
        g.append(f'<line x1="{x + w / 2:.1f}" x2="{x + w / 2:.1f}" y1="{y(b["p90"]):.1f}" '
                 f'y2="{y(b["min"]):.1f}" stroke="#555"/>')
        g.append(f'<rect x="{x:.1f}" y="{y(b["q3"]):.1f}" width="{w:.1f}" '
                 f'height="{max(y(b["q1"]) - y(b["q3"]), 1):.1f}" fill="#4e79a7"/>')
        g.append(f'<line x1="{x:.1f}" x2="{x + w:.1f}" y1="{y(b["median"]):.1f}" '
                 f'y2="{y(b["median"]):.1f}" stroke="white" stroke-width="2"/>')
        g.append(f'<text x="{x:.1f}" y="{H - 12}">{html.escape(b["bin"])}</text>'
                 f'<text x="{x:.1f}" y="{y(b["median"]) - 4:.1f}">{b["median"]:.0f}s</text>')
    g.append(f'<text x="2" y="20">{top:.0f} s</text></svg>')
    hours = c["hourly"]
    mx = max([h["startup_gpu_h"] + h["train_gpu_h"] for h in hours] + [1e-9])
    f = [f'<svg width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg" font-size="11">']
    bw = (W - 60) / max(len(hours), 1)
    for h in hours:
        x = 50 + h["hour"] * bw
        ht = (H - 40) * h["train_gpu_h"] / mx
        hs = (H - 40) * h["startup_gpu_h"] / mx
        f.append(f'<rect x="{x:.1f}" y="{H - 30 - ht:.1f}" width="{bw - 2:.1f}" height="{ht:.1f}" '
                 f'fill="#59a14f"><title>hour {h["hour"]}: training {h["train_gpu_h"]:.0f} GPU-h'
                 f'</title></rect><rect x="{x:.1f}" y="{H - 30 - ht - hs:.1f}" width="{bw - 2:.1f}"'
                 f' height="{max(hs, 0.5):.1f}" fill="#e15759"><title>startup '
                 f'{h["startup_gpu_h"]:.0f} GPU-h</title></rect>')
    f.append(f'<text x="50" y="{H - 12}">hour 0</text><text x="{W - 60}" y="{H - 12}">'
             f'hour {len(hours) - 1}</text></svg>')
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + html.escape(title)
            + "</title><style>body{font-family:sans-serif;margin:20px}pre{background:#f6f6f6;"
            "padding:8px}</style></head><body><h1>" + html.escape(title) + "</h1><pre>"
            + html.escape(report_text) + "</pre><h3>startup time by job size (box: q1-q3, "
            "whisker min-p90)</h3>" + "".join(g) + "<h3>GPU-hours per hour of the day: "
            "training (green) and startup (red)</h3>" + "".join(f) + "</body></html>")
