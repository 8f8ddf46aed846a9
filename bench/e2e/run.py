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
Prints time to ready (max over nodes), each start's startup overhead (its time to ready
minus the ideal's) and the ratio of overheads to the conventional start's, spread
(slowest/median) and each node's wait at rendezvous for the last node; writes
bench/results/e2e.json. Goals: 2nd's overhead <= 0.2 x conventional's, spread <= 1.2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from bootseer.demo import main as demo
from bootseer.demo import scenario as S
from bootseer.demo import tables
from bootseer.demo.scenario import Start

LARGE_TRAIN_ARGS = ["--dim", "1024", "--layers", "8", "--vocab", "16384"]
STARTS = [Start("conventional", ["--baseline"], attempt=0),
          Start("bootseer 1st", [], attempt=1),
          Start("bootseer 2nd", [], attempt=2),
          Start("2nd --no-prefetch", ["--no-prefetch"], attempt=3),
          Start("2nd --no-snapshot", ["--no-snapshot"], attempt=4),
          Start("2nd --no-stripe", ["--no-stripe"], attempt=5),
          Start("ideal warm-up", [], attempt=6, fresh_nodes=False),
          Start("ideal", [], attempt=7, fresh_nodes=False)]


def overheads(rows: dict[str, dict]) -> dict[str, dict]:
    """Per start: startup overhead (time to ready minus the ideal's) and its ratio to the
    conventional start's overhead."""
    ideal = rows["ideal"]["ready"]
    conv = rows["conventional"]["ready"]
    out = {}
    for name, row in rows.items():
        if name == "ideal warm-up" or row["ready"] is None or ideal is None:
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_arguments(p)
    p.add_argument("--large", action="store_true", help="the ~2.5 GB checkpoint")
    p.set_defaults(out="bench/results/e2e", per_connection="100m", scratch_size="16g")
    args = p.parse_args()
    from bootseer.demo.assets import TRAIN_ARGS
    train_args = LARGE_TRAIN_ARGS if args.large else TRAIN_ARGS
    if args.large and args.assets == demo.DEFAULT_ASSETS:
        args.assets = "/var/tmp/bootseer-bench-e2e/assets"
    say = demo.Progress()
    done = demo.run_starts(args, STARTS, assets_root=args.assets, train_args=train_args,
                           say=say)
    print()
    print(tables.render(done))
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
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.json").write_text(json.dumps(
        {"args": vars(args), "rows": rows, "overheads": table, "rendezvous_wait": waits,
         "nodes": {name: [{"node": r.node, "rc": r.rc, **r.summary} for r in results]
                   for name, results in done}}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
