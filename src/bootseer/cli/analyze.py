"""``bootseer analyze DIR``: characterize a cluster from many jobs' traces."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("analyze", help="share of GPU time lost to startup, startup by job "
                       "size, phase shares, restarts over many jobs",
                       description="Read a simulator's output (cluster.jsonl) or a directory "
                                   "of job traces and characterize the cluster.")
    p.add_argument("dir", help="simulator output directory / cluster.jsonl / traces directory "
                   "/ a store that 'bootseer run --trace URL' uploaded to")
    p.add_argument("--baseline", metavar="DIR", help="compare with this cluster")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--json", metavar="FILE", help="write a JSON summary")
    p.set_defaults(func=_run)


def _run(args) -> int:
    import json
    from bootseer import outputs
    from bootseer.trace import cluster
    recs, notes = cluster.read_attempts(args.dir)
    c = cluster.characterize(recs)
    out = cluster.text(c, notes)
    print(out)
    if args.baseline:
        b = cluster.characterize(cluster.read_attempts(args.baseline)[0])
        print()
        print(cluster.compare(c, b))
    if args.json:
        with outputs.open_output(args.json) as f:
            json.dump(c, f, indent=1)
    if args.html:
        with outputs.open_output(args.html) as f:
            f.write(cluster.to_html(c, f"bootseer analyze: {args.dir}", out))
    return 0
