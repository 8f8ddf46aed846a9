"""What ``uv sync`` puts on a node stays small: uv.lock holds no torch, CUDA or triton
wheels (bootseer.ckpt.dcp uses the job's own torch; there is no [dcp] extra because a
universal lock would pin PyPI's CUDA build of torch and its nvidia-* wheels, GBs, onto
every node: docs/cli.md, Installing and extras)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")


def test_the_lock_pins_no_torch_or_cuda():
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    heavy = sorted(p["name"] for p in lock["package"] if HEAVY.match(p["name"]))
    assert heavy == [], f"uv.lock pins {heavy}: keep torch and CUDA out of bootseer's lock"


def test_no_extra_brings_torch():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    brings = {name: reqs for name, reqs in extras.items()
              if any(re.match(r"torch\b", r) for r in reqs)}
    assert brings == {}, brings
