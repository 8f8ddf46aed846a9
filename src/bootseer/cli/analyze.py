"""``bootseer analyze DIR``: characterize a cluster from many jobs' traces."""

from __future__ import annotations

from bootseer.cli._flags import add_json_file_arg


def register(sub) -> None:
    p = sub.add_parser("analyze", help="share of GPU time lost to startup, startup by job "
                       "size, phase shares, restarts over many jobs",
                       description="Read a simulator's output (cluster.jsonl) or a directory "
                                   "of job traces and characterize the cluster.")
    p.add_argument("dir", help="simulator output directory / cluster.jsonl / traces directory "
                   "/ a store that 'bootseer run --trace URL' uploaded to")
    p.add_argument("--baseline", metavar="DIR", help="compare with this cluster")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report (- : "
                                                  "standard output)")
    add_json_file_arg(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    import json

    from bootseer.cli import text_stream, write_output
    from bootseer.cli._flags import JSON_SCHEMA
    from bootseer.report import cluster
    text_out = text_stream({"--json": args.json, "--html": args.html})
    recs, notes = cluster.read_attempts(args.dir)
    c = cluster.characterize(recs)
    out = cluster.text(c, notes)
    print(out, file=text_out)
    if args.baseline:
        b = cluster.characterize(cluster.read_attempts(args.baseline)[0])
        print(file=text_out)
        print(cluster.compare(c, b), file=text_out)
    if args.json:
        write_output(args.json, json.dumps({"schema": JSON_SCHEMA, **c}, indent=1))
    if args.html:
        write_output(args.html, cluster.to_html(c, f"bootseer analyze: {args.dir}", out))
    return 0
