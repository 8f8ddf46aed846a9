"""Every benchmark makes the results directory it writes into: ``bench/results/`` is
ignored by git, so a fresh clone has none."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_each_bench_that_writes_results_makes_their_directory():
    for run in sorted((ROOT / "bench").glob("*/run.py")):
        text = run.read_text()
        if "results" not in text or not re.search(r"write_text|open\(", text):
            continue
        assert "mkdir(parents=True, exist_ok=True)" in text, f"{run} never makes bench/results"
