"""bench/e2e: the demo's job (one torchrun job of N nodes, each node in its own network
namespace, through ``bootseer run``) at a larger size, with each technique switched off in
turn, against an ideal start.

    .venv/bin/python bench/e2e/run.py [--large] [--nodes 4] [--rate 1gbit] [--per-connection 100m]

--large uses a bigger model (a ~2.5 GB DCP checkpoint) than the demo (~330 MB); the
image is the demo's (Debian + Python 3.11 + torch CPU, ~1 GB unpacked).

Starts, each on fresh nodes (empty node caches, no environment) unless said:
  conventional        podman pull + unpack, pip install, single-stream checkpoint read
  bootseer 1st        lazy image (records hot blocks), snapshot built once, striped reads
  bootseer 2nd        lazy image with hot-block prefetch, snapshot restore, striped reads
  2nd --no-prefetch   ... without hot-block prefetch
  2nd --no-snapshot   ... with pip install instead of the snapshot
  2nd --no-stripe     ... with single-stream checkpoint reads
  ideal               the same nodes started a second time (after a warm-up start not
                      reported): image blocks in the node cache, environment present,
                      checkpoint staged on the node: the floor no startup tool can beat
  2nd, warm-up        fresh nodes, --warm with zygotes kept (BOOTSEER_WARM_KEEP_S): records
                      the modules the job imported before its first collective; at its
                      end each node keeps a zygote that imports them
  2nd, warm           the same nodes again, --warm: workers forked from the zygotes the
                      warm-up kept (the issue's "same nodes, zygotes prepared by the
                      previous start")
  ideal, warm-up      the ideal's nodes with --warm and kept zygotes (not reported)
  ideal, warm         the ideal start with warm workers from the zygotes kept by the
                      warm-up
Warm starts run with the cold starts' runtime (the default: podman where installed), their
zygotes kept between containers. Kept zygotes are stopped by PID once no later start uses
their nodes, and at the end.
Prints time to ready (max over nodes), each start's startup overhead (its time to ready
minus the ideal's) and the ratio of overheads to the conventional start's, spread
(slowest/median) and each node's wait at rendezvous for the last node; writes
bench/results/e2e.json. Goals: 2nd's overhead <= 0.2 x conventional's, spread <= 1.2;
job phase of "2nd, warm" <= 0.5 x "bootseer 2nd"'s, "ideal, warm" <= 0.6 x "ideal"; the
memory idle zygotes held is printed (per node, from its "zygote stopped" line).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # bench/outdir.py

import outdir

from bootseer.demo import main as demo
from bootseer.demo import scenario as S
from bootseer.demo import tables
from bootseer.demo.scenario import Start

# The warm starts share one rendezvous id: a kept zygote serves only the same command
# (a job's restart runs the same torchrun command line); each start has its own store.
WARM_FLAGS = ["--warm"]
WARM_ENV = {"BOOTSEER_WARM_KEEP_S": "600"}
LARGE_TRAIN_ARGS = ["--dim", "1024", "--layers", "8", "--vocab", "16384"]
STARTS = [Start("conventional", ["--baseline"], attempt=0),
          Start("bootseer 1st", [], attempt=1),
          Start("bootseer 2nd", [], attempt=2),
          Start("2nd --no-prefetch", ["--no-prefetch"], attempt=3),
          Start("2nd --no-snapshot", ["--no-snapshot"], attempt=4),
          Start("2nd --no-stripe", ["--no-stripe"], attempt=5),
          Start("ideal warm-up", [], attempt=6, fresh_nodes=False),
          Start("ideal", [], attempt=7, fresh_nodes=False),
          Start("2nd, warm-up", WARM_FLAGS, attempt=8, nodes="2nd-warm", env=WARM_ENV,
                rdzv="warm"),
          Start("2nd, warm", WARM_FLAGS, attempt=9, nodes="2nd-warm", env=WARM_ENV,
                rdzv="warm"),
          Start("ideal, warm-up", WARM_FLAGS, attempt=10, fresh_nodes=False, env=WARM_ENV,
                rdzv="warm"),
          Start("ideal, warm", WARM_FLAGS, attempt=11, fresh_nodes=False, env=WARM_ENV,
                rdzv="warm")]
WARMUPS = ("ideal warm-up", "ideal, warm-up", "2nd, warm-up")
# the supervisor's line at the job's end: a zygote of the job's container (stopped) or
# one kept for the next start
ZYGOTE_MB = re.compile(r"warm: zygote (?:stopped|kept) \((\d+) MiB held\)")


def overheads(rows: dict[str, dict]) -> dict[str, dict]:
    """Per start: startup overhead (time to ready minus the ideal's) and its ratio to the
    conventional start's overhead."""
    if "ideal" not in rows:   # a selection of starts (--start) without the ideal
        return {}
    ideal = rows["ideal"]["ready"]
    conv = rows["conventional"]["ready"] if "conventional" in rows else None
    out = {}
    for name, row in rows.items():
        if name in WARMUPS or row["ready"] is None or ideal is None:
            continue
        over = row["ready"] - ideal
        base = (conv - ideal) if conv is not None else None
        out[name] = {"ready": row["ready"], "overhead": over,
                     "vs_conventional": (over / base) if base else None,
                     "spread": row["spread"]}
    return out


def render_overheads(table: dict[str, dict], waits: dict[str, dict[str, float]]) -> str:
    head = ["start", "ready s", "overhead s", "overhead vs conventional", "slowest/median",
            "rendezvous wait per node s"]
    rows = [[name, f"{r['ready']:.1f}", f"{r['overhead']:.1f}",
             "-" if r["vs_conventional"] is None else f"{r['vs_conventional']:.2f}",
             "-" if r["spread"] is None else f"{r['spread']:.2f}",
             " ".join(f"{v:.1f}" for _, v in sorted(waits.get(name, {}).items()))]
            for name, r in table.items()]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


def zygote_mb(results, logs: Path) -> list[int]:
    """Per node, the memory its zygote held when the job ended (its supervisor's line), from
    the node logs kept in ``logs`` (the originals go with the scratch space)."""
    found = []
    for r in results:
        log = logs / r.log.name
        text = log.read_text(errors="replace") if log.exists() else ""
        found += [int(m) for m in ZYGOTE_MB.findall(text)]
    return found


def warm_summary(rows: dict[str, dict], done, logs: Path) -> str:
    """The warm rows against their cold counterparts: job phase, time to ready, and the
    memory idle zygotes held."""
    lines = []
    for warm, cold, goal, col in (("2nd, warm", "bootseer 2nd", 0.5, "job"),
                                  ("ideal, warm", "ideal", 0.6, "ready")):
        w, c = rows.get(warm, {}).get(col), rows.get(cold, {}).get(col)
        if w is not None and c:
            what = "job phase" if col == "job" else "time to ready"
            lines.append(f"{what}: {warm} {w:.1f} s vs {cold} {c:.1f} s = {w / c:.2f} "
                         f"(goal <= {goal:.2f})")
    if "ideal, warm" in rows and "ideal" in rows:
        w, c = rows["ideal, warm"].get("job"), rows["ideal"].get("job")
        if w is not None and c:
            lines.append(f"job phase: ideal, warm {w:.1f} s vs ideal {c:.1f} s = {w / c:.2f}")
    held = {name: zygote_mb(results, logs / name) for name, results in done if "warm" in name}
    for name, mbs in held.items():
        if mbs:
            lines.append(f"idle zygote memory, {name}: {max(mbs)} MiB max per node "
                         f"({sum(mbs)} MiB over {len(mbs)} nodes)")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_arguments(p)
    p.add_argument("--large", action="store_true", help="the ~2.5 GB checkpoint")
    p.add_argument("--start", action="append", default=[], metavar="NAME",
                   choices=[s.name for s in STARTS],
                   help="run only this start (repeatable; a warm start needs its warm-up "
                        "first), e.g. --start '2nd, warm-up' --start '2nd, warm'")
    p.set_defaults(out=str(outdir.root() / "e2e"), per_connection="100m", scratch_size="16g")
    args = p.parse_args()
    from bootseer.demo.assets import TRAIN_ARGS
    train_args = LARGE_TRAIN_ARGS if args.large else TRAIN_ARGS
    if args.large and args.assets == demo.DEFAULT_ASSETS:
        args.assets = "/var/tmp/bootseer-bench-e2e/assets"
    say = demo.Progress()
    starts = [s for s in STARTS if not args.start or s.name in args.start]
    done = demo.run_starts(args, starts, assets_root=args.assets, train_args=train_args,
                           say=say)
    print()
    # with the run's trace: where each start's hot set came from, and the checkpoint bytes
    # each node brought in per byte its ranks read
    print(tables.render(done, demo._trace_events(Path(args.out).resolve() / "trace")))
    rows = {name: tables.columns(results) for name, results in done}
    # Per-node wait at rendezvous for the last node, from each node's own timeline (the
    # nodes share the machine's clock).
    waits = {name: S.rendezvous_wait(results) for name, results in done}
    table = overheads(rows)
    print()
    print(render_overheads(table, waits))
    second = table.get("bootseer 2nd")
    if second and second["vs_conventional"] is not None:
        print(f"\n2nd start's overhead / conventional's = {second['vs_conventional']:.2f} "
              f"(goal <= 0.20); spread of 2nd = {second['spread']:.2f} (goal <= 1.20)")
    logs = Path(args.out).resolve() / "logs"
    warm = warm_summary(rows, done, logs)
    if warm:
        print("\n" + warm)
    outdir.write_json("e2e.json", {
        "args": vars(args), "rows": rows, "overheads": table, "rendezvous_wait": waits,
        "zygote_mb": {name: zygote_mb(results, logs / name) for name, results in done},
        "nodes": {name: [{"node": r.node, "rc": r.rc, **r.summary} for r in results]
                  for name, results in done}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
