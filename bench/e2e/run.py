"""bench/e2e: the demo's scenario at a larger size, with each technique switched off in turn.

    .venv/bin/python bench/e2e/run.py [--large] [--nodes 4] [--rate 1gbit] [--per-connection 100m]

--large uses a bigger model (a ~2.5 GB DCP checkpoint) than the demo (~330 MB); the
image is the demo's (Debian + Python 3.11 + torch CPU, ~1 GB unpacked).

Starts, each on fresh node-processes (empty node caches, no environment):
  conventional        podman pull + unpack, pip install, single-stream checkpoint read
  bootseer 1st        lazy image (records hot blocks), snapshot built once, striped reads
  bootseer 2nd        lazy image with hot-block prefetch, snapshot restore, striped reads
  2nd --no-prefetch   ... without hot-block prefetch
  2nd --no-snapshot   ... with pip install instead of the snapshot
  2nd --no-stripe     ... with single-stream checkpoint reads
Prints time to ready (max over nodes), spread (slowest/median) and ratios to the
conventional start, and writes bench/results/e2e.json. Goals: 2nd <= 0.3 x conventional,
spread <= 1.3.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from bootseer.demo import main as demo  # noqa: E402
from bootseer.demo import tables  # noqa: E402
from bootseer.demo.scenario import Start  # noqa: E402

LARGE_TRAIN_ARGS = ["--dim", "1024", "--layers", "8", "--vocab", "16384"]
STARTS = [Start("conventional", ["--baseline"], attempt=0),
          Start("bootseer 1st", [], attempt=1),
          Start("bootseer 2nd", [], attempt=2),
          Start("2nd --no-prefetch", ["--no-prefetch"], attempt=3),
          Start("2nd --no-snapshot", ["--no-snapshot"], attempt=4),
          Start("2nd --no-stripe", ["--no-stripe"], attempt=5)]


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
    base = rows["conventional"]["ready"]
    second = rows["bootseer 2nd"]["ready"]
    print()
    if base and second:
        print(f"2nd start / conventional = {second / base:.2f} (goal <= 0.30); "
              f"spread of 2nd = {rows['bootseer 2nd']['spread']:.2f} (goal <= 1.30)")
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.json").write_text(json.dumps(
        {"args": vars(args), "rows": rows,
         "nodes": {name: [{"node": r.node, "rc": r.rc, **r.summary} for r in results]
                   for name, results in done}}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
