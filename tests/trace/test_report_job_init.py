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
    if not (warm or {}).get("hit"):   # a worker forked from the zygote imports nothing
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
    # served warm: from the fork (job.warm's end, 1.12) to the first collective, less init
    assert rows["n0"]["model build"] == pytest.approx(1.2 + 0.15 + 2.0 - 1.12, abs=1e-3)
    assert "imports" not in rows["n0"] and "interpreter" not in rows["n0"]
    assert rows["n1"]["model build"] == pytest.approx(3.0, abs=1e-3)
    assert rows["n1"]["imports"] == pytest.approx(6.0)
    assert rows["n0"]["warm"] == "hit"
    assert rows["n1"]["warm"] == "miss: key differs: file.train.py"
    out = text([s])
    assert "job init (median over ranks): imports 6.00 s, model build 2.62 s, served warm " \
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


def test_a_forked_worker_records_under_its_own_rank(tmp_path):
    """A zygote's child takes the worker's environment after the fork: its recorder is
    made again with the worker's RANK, so its phases land in its rank's row."""
    import subprocess
    import sys
    probe = ("import os; from bootseer.trace import record; a = record.recorder().rank; "
             "os.environ['RANK'] = '3'; print(a, record.recorder().rank)")
    env = {"PATH": "/usr/bin:/bin", "BOOTSEER_TRACE_LOCATION": str(tmp_path),
           "PYTHONPATH": ":".join(sys.path)}
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert r.stdout.split() == ["None", "3"], r.stderr


def test_a_torchrun_launcher_served_warm_is_counted_apart_from_the_ranks(tmp_path):
    _node(tmp_path, "n0", 0, imports_s=0.05, build_s=2.0, warm={"hit": True})
    t = NodeTrace(tmp_path, "n0")   # torchrun itself: no rank, its own pid
    t.span("job.warm", 1.0, 1.02, pid=400, hit=True, launcher="torch.distributed.run")
    t.span("import.torch.distributed.elastic", 1.05, 1.3, pid=400)
    t.write()
    (view,) = attempts(load.load(tmp_path / "job").events)
    s = summarize(view)
    launcher = next(r for r in s.ranks if r["rank"] == "pid 400")
    assert launcher["launcher"] == "torch.distributed.run" and launcher["warm"] == "hit"
    assert "served warm 1 of 1 ranks, served warm 1 of 1 launchers" in text([s])
