"""``bootseer report TRACE``: explain one job's startup."""

from __future__ import annotations

from bootseer.cli._flags import add_json_file_arg


def register(sub) -> None:
    p = sub.add_parser("report", help="explain a job's startup: time to ready, gating node "
                       "and phase, stragglers, GPU-seconds lost",
                       description="Read a job's trace (a directory of .jsonl files) and print "
                                   "the per-phase breakdown, critical path and stragglers.")
    p.add_argument("trace", help="trace directory (or one .jsonl file), a store that "
                   "'bootseer run --trace URL' uploaded to (oci://, s3://, http(s)://, "
                   "file:///dir; URL/JOB or --job), or a URL of a trace directory (any "
                   "fsspec location)")
    p.add_argument("--job", metavar="ID", help="the job to report from a store holding "
                   "several")
    p.add_argument("--baseline", metavar="TRACE", help="compare with this trace")
    p.add_argument("--attempt", type=int, help="only this attempt")
    p.add_argument("-k", type=float, default=3.0, help="straggler rule: median + k*MAD")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    add_json_file_arg(p, "; the text report then goes to standard error, as for the others")
    p.add_argument("--chrome", metavar="FILE", help="write a Chrome/Perfetto trace (a track "
                   "per pipeline per node, absolute times)")
    p.add_argument("--otlp", metavar="FILE|URL", nargs="?", const="",
                   help="OpenTelemetry spans: write OTLP/JSON to FILE, or send to a receiver "
                   "(http://collector:4318, grpc://collector:4317); alone: to "
                   "OTEL_EXPORTER_OTLP_ENDPOINT, with OTEL_EXPORTER_OTLP_HEADERS/_PROTOCOL")
    p.add_argument("--traceparent", metavar="TP", help="join the job's own trace: a W3C "
                   "traceparent (default: $TRACEPARENT)")
    p.add_argument("--prom", metavar="FILE", help="write Prometheus metrics (text format, for "
                   "node_exporter's textfile collector: name it *.prom)")
    p.add_argument("--prom-max-age", metavar="AGE", help="with --prom: also remove bootseer's "
                   "*.prom files in that directory last written more than AGE ago (24h, 7d), "
                   "so finished jobs' series do not pile up")
    p.set_defaults(func=_run)


def _prom_max_age(args) -> float | None:
    if args.prom_max_age is None:
        return None
    from bootseer.errors import UsageError
    from bootseer.report import prom_files
    if not args.prom:
        e = UsageError("--prom-max-age prunes the directory of --prom; there is none")
        e.hint = "add --prom DIR/JOB.prom (node_exporter's textfile directory)"
        raise e
    return prom_files.parse_age(args.prom_max_age)


def _run(args) -> int:
    from bootseer.cli import text_stream, write_output
    from bootseer.report import explain, export_otlp, render
    max_age = _prom_max_age(args)
    otlp_send = args.otlp is not None and (not args.otlp or export_otlp.is_url(args.otlp))
    text_out = text_stream({"--json": args.json, "--chrome": args.chrome, "--html": args.html,
                            "--otlp": None if otlp_send else args.otlp, "--prom": args.prom})
    t, views, sums = explain.build(args.trace, args.k, args.attempt, args.job)
    report = render.text(sums, t.skipped_lines, t.problems)
    print(report, file=text_out)
    base = None
    if args.baseline:
        _, _, base = explain.build(args.baseline, args.k, None)
        print(file=text_out)
        print(render.compare(sums, base), file=text_out)
    if args.json:
        write_output(args.json, render.to_json(sums))
    if args.chrome:
        write_output(args.chrome, render.chrome(views, sums))
    if args.html:
        write_output(args.html, render.to_html(views, sums, f"bootseer report: {args.trace}",
                                               report, base))
    job = str(t.events[0]["job"])
    if args.otlp is not None:
        import os
        tp = args.traceparent or os.environ.get("TRACEPARENT")
        body = export_otlp.to_json(job, views, sums,
                                   parent=export_otlp.parse_traceparent(tp) if tp else None,
                                   resource=export_otlp.resource_attributes(os.environ))
        if otlp_send:
            export_otlp.send(export_otlp.target(args.otlp, os.environ), body)
        else:
            write_output(args.otlp, body)
    if args.prom:
        from bootseer.report import export_prom
        write_output(args.prom, export_prom.text(job, views, sums))
        if max_age is not None and args.prom != "-":
            from pathlib import Path

            from bootseer.report import prom_files
            prom = Path(args.prom)
            for gone in prom_files.prune(prom.parent, max_age, keep=prom):
                print(f"removed stale {gone}", file=text_out)
    return 0
