"""``bootseer report TRACE``: explain one job's startup."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("report", help="explain a job's startup: time to ready, gating node "
                       "and phase, stragglers, GPU-seconds lost",
                       description="Read a job's trace (a directory of .jsonl files) and print "
                                   "the per-phase breakdown, critical path and stragglers.")
    p.add_argument("trace", help="trace directory (or one .jsonl file)")
    p.add_argument("--baseline", metavar="TRACE", help="compare with this trace")
    p.add_argument("--attempt", type=int, help="only this attempt")
    p.add_argument("-k", type=float, default=3.0, help="straggler rule: median + k*MAD (3)")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--json", metavar="FILE", help="write a JSON summary")
    p.add_argument("--chrome", metavar="FILE", help="write a Chrome/Perfetto trace")
    p.set_defaults(func=_run)


def build(path: str, k: float, attempt: int | None):
    from bootseer.errors import TraceError
    from bootseer.trace import analysis, load
    t = load.load(path)
    jobs = sorted({str(e["job"]) for e in t.events})
    if len(jobs) > 1:
        raise TraceError(f"{path} mixes {len(jobs)} jobs ({', '.join(jobs[:5])}): report one "
                         f"job's directory (e.g. {path}/{jobs[0]}) or use 'bootseer analyze'")
    views = analysis.attempts(t.events)
    if attempt is not None:
        views = [v for v in views if v.attempt == attempt]
    if not views:
        raise TraceError(f"{path}: no events" + (f" for attempt {attempt}" if attempt is not None else ""))
    return t, views, [analysis.summarize(v, k) for v in views]


def _run(args) -> int:
    from bootseer import outputs
    from bootseer.trace import render
    for path in (args.json, args.chrome, args.html):
        if path:
            outputs.check(path)   # before the work, not after it
    t, views, sums = build(args.trace, args.k, args.attempt)
    report = render.text(sums, t.skipped_lines, t.problems)
    print(report)
    if args.baseline:
        _, _, base = build(args.baseline, args.k, None)
        print()
        print(render.compare(sums, base))
    if args.json:
        outputs.write_text(args.json, render.to_json(sums))
    if args.chrome:
        outputs.write_text(args.chrome, render.chrome(views))
    if args.html:
        outputs.write_text(args.html, render.to_html(views, sums, f"bootseer report: {args.trace}",
                                                     report))
    return 0
