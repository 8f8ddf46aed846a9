"""The report splits the job's own init per rank (imports, model build) and shows whether
each worker was served warm (``job.warm``, from the warm launcher)."""

from __future__ import annotations

import pytest

from bootseer.report import load
from bootseer.report.export_html import _rank_table
from bootseer.report.render import text
from bootseer.report.summary import model_build, summarize
from bootseer.report.views import attempts
from tests.trace.report_traces import NodeTrace


def _node(root, node: str, rank: int, *, imports_s: float, build_s: float, warm: dict | None):
    t = NodeTrace(root, node)
    t.span("startup.prepare", 0.0, 1.0)
    t.span("job.run", 1.0, 60.0)
    if warm is not None:   # the launcher: its own pid, the worker's rank
        t.span("job.warm", 1.1, 1.12, pid=300, rank=rank, **warm)
    p = 1.2
    t.span("python.start", p, p + 0.1, pid=200, rank=rank)
    t.span("import.torch", p + 0.1, p + 0.1 + imports_s, pid=200, rank=rank)
    p += 0.1 + imports_s
    t.span("dist.init", p, p + 0.5, pid=200, rank=rank)   # init, then the model is built
    p += 0.5 + build_s
    t.span("dist.first_collective", p, p + 0.2, pid=200, rank=rank, op="broadcast")
    t.span("ckpt.load", p + 0.2, p + 1.2, pid=200, rank=rank)
    t.span("train.first_step", p + 1.2, p + 2.2, pid=200, rank=rank)
    t.mark("ready", p + 2.2, pid=200, rank=rank)
    t.mark("ready", p + 2.3)
    t.write()


def test_imports_model_build_and_warm_outcome_per_rank(tmp_path):
    _node(tmp_path, "n0", 0, imports_s=0.05, build_s=2.0, warm={"hit": True})
    _node(tmp_path, "n1", 1, imports_s=6.0, build_s=3.0,
          warm={"hit": False, "why": "key differs: file.train.py"})
    (view,) = attempts(load.load(tmp_path / "job").events)
    s = summarize(view)
    rows = {r["node"]: r for r in s.ranks}
    assert rows["n0"]["model build"] == pytest.approx(2.0, abs=1e-3)   # dist.init left out
    assert rows["n1"]["model build"] == pytest.approx(3.0, abs=1e-3)
    assert rows["n1"]["imports"] == pytest.approx(6.0)
    assert rows["n0"]["warm"] == "hit"
    assert rows["n1"]["warm"] == "miss: key differs: file.train.py"
    out = text([s])
    assert "job init (median over ranks): imports 3.02 s, model build 2.50 s, served warm " \
           "1 of 2 ranks (cold: key differs: file.train.py)" in out, out
    assert "model build s" in out and "warm" in out.split("model build s")[1].splitlines()[0]
    page = _rank_table(s)
    assert "served warm 1 of 2 ranks" in page and "<th>warm</th>" in page


def test_a_cold_start_has_no_warm_column_and_model_build_needs_both_ends(tmp_path):
    _node(tmp_path, "n0", 0, imports_s=1.0, build_s=1.5, warm=None)
    (view,) = attempts(load.load(tmp_path / "job").events)
    s = summarize(view)
    assert "warm" not in s.ranks[0] and "served warm" not in text([s])
    assert model_build({"imports": [(0.0, 1.0)]}) is None              # nothing after imports
    assert model_build({"first collective": [(2.0, 3.0)]}) is None     # no imports traced
    assert model_build({"imports": [(0.0, 1.0)], "ckpt.load": [(3.0, 4.0)],
                        "dist.init": [(0.5, 1.5)]}) == pytest.approx(1.5)
