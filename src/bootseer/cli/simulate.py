"""``bootseer simulate``: a cluster of jobs starting, in bootseer's trace formats."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("simulate", help="simulate many jobs starting (calibrated to the "
                       "published startup figures) and write their traces",
                       description="Writes OUT/cluster.jsonl (one line per job attempt) for "
                                   "'bootseer analyze', and full traces of the first --events "
                                   "jobs under OUT/traces/ for 'bootseer report'.")
    p.add_argument("out", help="output directory")
    p.add_argument("--jobs", type=int, default=30000, help="jobs to simulate")
    p.add_argument("--seed", type=int, default=0, help="random seed (the same seed, the same run)")
    p.add_argument("--techniques", default="none",
                   help="all, none, or a comma list of image,deps,ckpt,overlap,peers")
    p.add_argument("--ckpt-shared-by", type=int, default=1, metavar="N",
                   help="nodes that read the same checkpoint bytes (data-parallel replicas "
                        "across nodes); with 'peers' they share them (default 1: every "
                        "node its own shard)")
    p.add_argument("--events", type=int, default=0, metavar="N",
                   help="also write full per-node traces of the first N jobs")
    p.set_defaults(func=_run)


def parse_techniques(text: str) -> tuple:
    from bootseer.errors import ConfigError
    from bootseer.report.simulate import TECHNIQUES
    if text == "all":
        return TECHNIQUES
    if text in ("none", ""):
        return ()
    got = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in got if t not in TECHNIQUES]
    if bad:
        raise ConfigError("--techniques", f"unknown technique(s) {', '.join(bad)}: choose "
                          f"from {', '.join(TECHNIQUES)}, 'all' or 'none'")
    return got


def _run(args) -> int:
    from bootseer.errors import ConfigError
    from bootseer.report.simulate import SimParams, simulate
    if args.jobs < 1:
        raise ConfigError("--jobs", f"must be at least 1, got {args.jobs}")
    if args.ckpt_shared_by < 1:
        raise ConfigError("--ckpt-shared-by", f"must be at least 1, got {args.ckpt_shared_by}")
    r = simulate(SimParams(jobs=args.jobs, seed=args.seed,
                           techniques=parse_techniques(args.techniques),
                           ckpt_shared_by=args.ckpt_shared_by),
                 args.out, events_jobs=args.events)
    print(f"wrote {r.attempts} attempts of {r.jobs} jobs to {r.path}")
    return 0
