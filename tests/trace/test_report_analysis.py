"""The report's analysis: clock steps, one lane per pipeline, the critical path, the job's
phases per rank, the technique figures."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bootseer.report import load
from bootseer.report.summary import summarize
from bootseer.report.views import attempts
from tests.trace.report_traces import NodeTrace, demo_node

pytestmark = pytest.mark.timeout(120)


def _summary(root, attempt=0):
    views = attempts(load.load(root / "job").events)
    view = next(v for v in views if v.attempt == attempt)
    return view, summarize(view)


def test_wall_clock_step_during_a_phase_keeps_the_monotonic_durations(tmp_path):
    """The wall clock steps back an hour during image.pull (the monotonic clock says it took
    30 s): the phase keeps its 30 s, the later phases their place, and --html works."""
    t = NodeTrace(tmp_path, "a")
    t.span("deps.install", 0, 10, rank=0)
    pull = t.span("image.pull", 0, 30, rank=0)
    run = t.span("job.run", 30, 40, rank=0)
    ready = t.mark("ready", 40, rank=0)
    for e in (run, ready):
        e["start"] -= 3600
        e["end"] -= 3600
    pull["end"] -= 3600
    t.write()
    view, s = _summary(tmp_path)
    assert s.time_to_ready == pytest.approx(40.0)
    assert s.phases["image.pull"].max == pytest.approx(30.0)
    assert s.gating_phase == "image.pull"
    assert any("wall clock stepped" in p for p in s.problems)
    assert not any("clamped" in p for p in load.load(tmp_path / "job").problems)
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "job"),
                        "--html", str(tmp_path / "r.html")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "image.pull" in (tmp_path / "r.html").read_text()


def test_a_forward_step_does_not_stretch_a_phase(tmp_path):
    t = NodeTrace(tmp_path, "a")
    t.span("image.pull", 0, 5, rank=0)["end"] += 600      # stepped 10 min ahead while pulling
    later = t.mark("ready", 6, rank=0)
    later["start"] += 600
    later["end"] += 600
    t.write()
    _, s = _summary(tmp_path)
    assert s.phases["image.pull"].max == pytest.approx(5.0)
    assert s.time_to_ready == pytest.approx(6.0)


def test_one_lane_per_pipeline_with_properly_nested_tracks(tmp_path):
    demo_node(tmp_path, "n0").write()
    view, _ = _summary(tmp_path)
    (n,) = view.nodes
    assert n.lanes == ["startup", "image", "deps", "ckpt rank 0", "ckpt pid 100",
                       "job rank 0", "job pid 100"] or set(n.lanes) == {
        "startup", "image", "deps", "ckpt pid 100", "ckpt rank 0", "job pid 100", "job rank 0"}
    lane = {s["phase"]: s["lane"] for s in n.spans}
    assert lane["image.mount"] == lane["image.lazy"] == "image"
    assert lane["deps.extract"] == lane["deps.fetch"] == "deps"
    assert lane["import.numpy"] == lane["dist.init"] == "job rank 0"
    # per lane and track, slices nest: none overlaps another without containing it
    by_track: dict = {}
    for s in n.spans:
        by_track.setdefault((s["lane"], s["track"]), []).append(s)
    for spans in by_track.values():
        for a in spans:
            for b in spans:
                if a is not b and a["start"] < b["start"] < a["end"]:
                    assert b["end"] <= a["end"] + 1e-6, (a["phase"], b["phase"])
    # deps.fetch overlaps deps.extract without nesting: a second track of the deps lane
    tracks = {s["phase"]: s["track"] for s in n.spans if s["lane"] == "deps"}
    assert tracks["deps.fetch"] != tracks["deps.extract"]
    assert {m["phase"] for m in n.marks} >= {"rendezvous", "ready", "image.window"}


def test_critical_path_is_the_chain_that_gated_not_summed_medians(tmp_path):
    """n2's image pipeline (6 s) gates its job start and so everyone's rendezvous; deps
    (2.5 s) runs beside it and is not on the path; the segments add up to the time to
    ready."""
    rendezvous = 6.05 + 0.05 + 0.2 + 3.0 + 0.5      # when n2, the last, arrived
    for i in range(3):
        demo_node(tmp_path, f"n{i}", rank=i, image_s=6.0 if i == 2 else 4.0,
                  rendezvous_at=rendezvous).write()
    _, s = _summary(tmp_path)
    # all ranks leave the rendezvous together: whichever node was ready last, its path
    # crosses at the rendezvous to n2, the last to arrive
    phases = [x.phase for x in s.critical_path if x.seconds > 0.015]
    assert {x.node for x in s.critical_path[:2]} == {"n2"}
    # startup.prepare wraps the pipelines: on the path only for its own 50 ms after them
    assert phases[:3] == ["image.lazy", "startup.prepare", "job.run"]
    assert [x.seconds for x in s.critical_path if x.phase == "startup.prepare"] == \
        [pytest.approx(0.05, abs=1e-3)]
    assert "deps.restore" not in phases
    assert phases.index("import.torch") < phases.index("dist.init") < phases.index("ckpt.load") \
        < phases.index("train.first_step")
    total = sum(x.seconds for x in s.critical_path)
    assert total == pytest.approx(s.time_to_ready, abs=0.01)
    assert s.path_shares["image"] == pytest.approx(6.0, abs=0.01)
    assert sum(s.path_shares.values()) == pytest.approx(s.time_to_ready, abs=0.01)


def test_rendezvous_wait_per_rank_and_technique_figures(tmp_path):
    """n1's imports take 5 s longer: every other rank waits ~5 s at the first collective."""
    late = 4.05 + 0.05 + 0.2 + 3.0 + 5.0 + 0.5
    for i in range(3):
        demo_node(tmp_path, f"n{i}", rank=i, imports_s=8.0 if i == 1 else 3.0,
                  rendezvous_at=late).write()
    _, s = _summary(tmp_path)
    waits = {r["node"]: r["rendezvous_wait"] for r in s.ranks}
    assert waits["n1"] == pytest.approx(0.0, abs=1e-6)
    assert waits["n0"] == pytest.approx(5.0, abs=0.01)
    assert waits["n2"] == pytest.approx(5.0, abs=0.01)
    row = next(r for r in s.ranks if r["node"] == "n0")
    assert row["imports"] == pytest.approx(3.0) and row["first step"] == pytest.approx(2.0)
    assert s.figures["image"]["coverage"] == pytest.approx(0.97)
    assert s.figures["ckpt"]["mb_per_s"] == pytest.approx(400.0)
    assert s.figures["deps"]["restore_s"] == pytest.approx(2.499, abs=0.01)


def test_the_first_collective_is_where_ranks_wait(tmp_path):
    """With the auto-capture's dist.first_collective, the wait is measured there (init is
    quick for everyone), and the critical path crosses there to the last rank to arrive."""
    late = 4.05 + 0.05 + 0.2 + 8.0 + 0.5
    for i in range(3):
        demo_node(tmp_path, f"n{i}", rank=i, imports_s=8.0 if i == 1 else 3.0,
                  rendezvous_at=late, first_collective=True).write()
    _, s = _summary(tmp_path)
    waits = {r["node"]: r["rendezvous_wait"] for r in s.ranks}
    assert waits["n1"] == pytest.approx(0.0, abs=1e-6)
    assert waits["n0"] == pytest.approx(5.0, abs=0.01)
    assert all(r["dist.init"] == pytest.approx(0.3) for r in s.ranks)
    long = [x for x in s.critical_path if x.seconds > 0.1]
    assert [x.node for x in long if x.phase == "import.torch"] == ["n1"]
    assert s.gating_node == "n1" and s.gating_phase == "import.torch"


def test_a_pipeline_thread_waited_on_the_launcher_not_on_its_siblings(tmp_path):
    """The deps thread started 20 ms after the image thread: those 20 ms are the launcher's
    (startup.prepare starting its threads), not the image pipeline's."""
    t = NodeTrace(tmp_path, "a")
    t.span("startup.prepare", 0.0, 6.05)
    t.span("image.lazy", 0.001, 4.0)
    t.span("deps.restore", 0.02, 6.0)
    t.span("job.run", 6.06, 20.0)
    t.mark("ready", 10.0)
    t.write()
    _, s = _summary(tmp_path)
    assert [x.phase for x in s.critical_path if x.seconds > 0.015] == [
        "startup.prepare", "deps.restore", "startup.prepare", "job.run"]
    assert s.path_shares["deps"] == pytest.approx(5.98) and "image" not in s.path_shares
    assert s.gating_phase == "deps.restore"
