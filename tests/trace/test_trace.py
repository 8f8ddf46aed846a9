"""Recording and reporting: the API, crash-torn files, killed nodes, the report forms."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from bootseer.report import load
from bootseer.report.summary import summarize
from bootseer.report.views import UNTRACED, attempts

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tracing(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOTSEER_TRACE_LOCATION", str(tmp_path / "t"))
    monkeypatch.setenv("BOOTSEER_TRACE_JOB_ID", "j1")
    monkeypatch.setenv("BOOTSEER_TRACE_NODE", "n0")
    return tmp_path / "t"


def test_phases_nest_fail_and_mark(tracing):
    from bootseer import trace
    with trace.phase("startup") as s:
        with trace.phase("ckpt.load", bytes=10, password="hunter2"):
            pass
        s.set(hits=3)
    with pytest.raises(ValueError):
        with trace.phase("deps.restore"):
            raise ValueError("boom")
    trace.mark("ready")

    @trace.traced("decorated")
    def f():
        return 5
    assert f() == 5
    t = load.load(tracing)
    by = {e["phase"]: e for e in t.events}
    assert by["ckpt.load"]["parent"] == "startup" and by["startup"]["attrs"]["hits"] == 3
    assert by["ckpt.load"]["attrs"]["password"] == "<redacted>"
    assert by["deps.restore"]["status"] == "failed"
    assert "boom" in by["deps.restore"]["attrs"]["error"]
    assert by["ready"]["kind"] == "mark" and "decorated" in by
    assert by["startup"]["end"] >= by["ckpt.load"]["end"] >= by["ckpt.load"]["start"]


def test_disabled_is_a_noop(monkeypatch, tmp_path):
    monkeypatch.delenv("BOOTSEER_TRACE_LOCATION", raising=False)
    from bootseer import trace
    with trace.phase("x"):
        trace.mark("ready")
    assert not any(tmp_path.iterdir())


def write_node(root, node, phases, ready, attempt=0, gpus=8, torn=False, rdzv=None, skew=0.0):
    d = root / "job" / str(attempt)
    d.mkdir(parents=True, exist_ok=True)
    lines = []
    base = 1000.0 + skew
    for name, s, e in phases:
        lines.append({"v": 1, "job": "job", "attempt": attempt, "node": node, "gpus": gpus,
                      "kind": "span", "phase": name, "parent": None, "start": base + s,
                      "end": base + e, "status": "ok", "attrs": {}})
    for name, t in (("rendezvous", rdzv), ("ready", ready)):
        if t is not None:
            lines.append({"v": 1, "job": "job", "attempt": attempt, "node": node, "gpus": gpus,
                          "kind": "mark", "phase": name, "start": base + t, "end": base + t})
    text = "".join(json.dumps(x) + "\n" for x in lines)
    if torn:
        text += '{"v": 1, "job": "job", "phase": "half'
    (d / f"{node}-1.jsonl").write_text(text)


def test_gating_phase_of_nodes_in_step_is_the_longest_innermost(tmp_path):
    """No straggler: every node waited on the same long phase; the slowest node's biggest
    excess over the median (a few ms of a short phase) is noise, not the cause. Overlapping
    phases of equal length (prepare spans the pull) name the inner one."""
    for i in range(4):
        write_node(tmp_path, f"n{i}", [("startup.prepare", 0, 40 + i * 0.01),
                                       ("image.pull", 0.05, 40 + i * 0.01),
                                       ("deps.install", 0, 5 + (0.5 if i == 3 else 0)),
                                       ("job.run", 40, 50 + i * 0.01)], 50 + i * 0.01)
    (v,) = attempts(load.load(tmp_path / "job").events)
    s = summarize(v)
    assert s.stragglers == [] and s.gating_node == "n3"
    assert s.gating_phase == "image.pull"


def test_report_names_gating_node_stragglers_and_killed(tmp_path):
    for i in range(6):
        slow = 30.0 if i == 4 else 0.0
        write_node(tmp_path, f"n{i}", [("image.pull", 0, 10 + slow + i * 0.1),
                                       ("deps.install", 0, 5 + i * 0.1)], 12 + slow + i * 0.1,
                   torn=(i == 1))
    write_node(tmp_path, "n9", [("image.pull", 0, 3)], None)   # killed during startup
    t = load.load(tmp_path / "job")
    assert t.skipped_lines == 1
    (v,) = attempts(t.events)
    s = summarize(v)
    assert s.time_to_ready is None and s.not_ready == ["n9"]
    assert s.gating_node == "n4" and s.gating_phase == "image.pull" and s.stragglers == ["n4"]
    assert s.what_if == pytest.approx(12.5, abs=0.6)
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "job"),
                        "--html", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json"),
                        "--chrome", str(tmp_path / "c.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "NOT READY: n9" in r.stdout and "gated by node n4, phase image.pull" in r.stdout
    assert "skipped 1 unreadable line" in r.stdout
    page = (tmp_path / "r.html").read_text()
    # the charting library embedded, nothing loaded from a network
    assert "uPlot" in page and not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)
    assert json.loads((tmp_path / "c.json").read_text())["traceEvents"]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["schema"] == 1 and doc["attempts"][0]["gating_node"] == "n4"


def test_clock_alignment_on_rendezvous(tmp_path):
    write_node(tmp_path, "a", [("x", 0, 5)], 6, rdzv=2)
    write_node(tmp_path, "b", [("x", 0, 5)], 6, rdzv=2, skew=100.0)  # clock 100 s ahead
    (v,) = attempts(load.load(tmp_path / "job").events)
    s = summarize(v)
    assert s.alignment == "rendezvous marks" and s.time_to_ready == pytest.approx(6.0)


def test_compare_and_gpu_seconds(tmp_path):
    write_node(tmp_path / "base", "a", [("image.pull", 0, 40)], 50, gpus=8)
    write_node(tmp_path / "new", "a", [("image.pull", 0, 10)], 20, gpus=8)
    write_node(tmp_path / "new", "a", [("image.pull", 0, 8)], 18, gpus=8, attempt=1)
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "new/job"),
                        "--baseline", str(tmp_path / "base/job")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "restarts: 1" in r.stdout and "GPU-seconds lost in all: 304" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines()]
    assert ["TIME", "TO", "READY", "50.0", "18.0", "64%"] in rows


def test_missing_and_empty_traces(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "nope")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "no trace at" in r.stderr
    (tmp_path / "empty").mkdir()
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "empty")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "no trace files" in r.stderr


def test_trace_exec_cli(tmp_path):
    env = {**os.environ, "BOOTSEER_TRACE_LOCATION": str(tmp_path), "BOOTSEER_TRACE_JOB_ID": "cli"}
    r = subprocess.run([sys.executable, "-m", "bootseer", "trace", "exec", "--phase",
                        "deps.install", "--", "sh", "-c", "exit 3"], env=env)
    assert r.returncode == 3
    ev = load.load(tmp_path).events
    assert ev[0]["phase"] == "deps.install" and ev[0]["attrs"]["exit"] == 3
    assert ev[0]["status"] == "failed" and "exited with 3" in ev[0]["attrs"]["error"]
    r = subprocess.run([sys.executable, "-m", "bootseer", "trace", "exec", "--phase", "x", "--",
                        "sh", "-c", "kill -TERM $$"], env=env)
    assert r.returncode == 128 + 15
    r = subprocess.run([sys.executable, "-m", "bootseer", "trace", "exec", "--phase", "y", "--",
                        str(tmp_path / "no-such-cmd")], env=env, capture_output=True, text=True)
    assert r.returncode == 127 and "cannot run" in r.stderr
    r = subprocess.run([sys.executable, "-m", "bootseer", "trace", "exec", "--phase", "z", "--",
                        "true"], env=env)
    assert r.returncode == 0
    by = {e["phase"]: e for e in load.load(tmp_path).events}
    assert "killed by signal 15" in by["x"]["attrs"]["error"] and by["y"]["attrs"]["exit"] == 127
    assert by["z"]["status"] == "ok" and "error" not in by["z"]["attrs"]


def test_overhead_is_small(tracing):
    from bootseer import trace
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        with trace.phase("p"):
            pass
    per_event_us = (time.perf_counter() - t) / n * 1e6
    assert len(load.load(tracing).events) == n
    print(f"{per_event_us:.1f} us per event")  # the benchmark, bench/trace, reports this figure


def test_duplicates_end_before_start_and_mixed_jobs(tmp_path):
    write_node(tmp_path, "a", [("x", 0, 5), ("y", 9, 4)], 6)   # y ends before it starts
    f = tmp_path / "job/0/a-1.jsonl"
    (tmp_path / "job/0/copy.jsonl").write_text(f.read_text())  # the same events twice
    with open(tmp_path / "job/0/copy.jsonl", "ab") as fh:   # garbage of every kind
        fh.write(b'[1, 2]\n\xff\xfe\n{"job": "job", "attempt": 0, "node": "a", "phase": "z",'
                 b' "start": "soon", "end": "later"}\n{"job": "job", "attempt": "0", "node": "a",'
                 b' "phase": "z", "start": 1, "end": 2}\n'
                 b'{"job": "job", "attempt": 0, "node": ["a"], "phase": "z", "start": 1,'
                 b' "end": 2}\n')
    t = load.load(tmp_path / "job")
    assert t.duplicates == 3 and len(t.events) == 3 and t.skipped_lines == 5
    assert any("ends before it starts" in p for p in t.problems)
    assert any("3 duplicate" in p for p in t.problems)
    (y,) = [e for e in t.events if e["phase"] == "y"]
    assert y["end"] == y["start"]
    other = tmp_path / "job/0/b-1.jsonl"
    other.write_text(json.dumps({"v": 1, "job": "other", "attempt": 0, "node": "b",
                                 "phase": "x", "start": 1, "end": 2}) + "\n")
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "job")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "mixes 2 jobs (job, other)" in r.stderr


def test_rank_missing_ready_makes_node_not_ready(tmp_path):
    d = tmp_path / "job/0"
    d.mkdir(parents=True)
    ev = lambda pid, rank, kind, phase, t: {"v": 1, "job": "job", "attempt": 0, "node": "h",  # noqa: E731
                                             "pid": pid, "rank": rank, "kind": kind,
                                             "phase": phase, "start": t, "end": t + 1}
    (d / "h-1.jsonl").write_text("\n".join(json.dumps(x) for x in [
        ev(1, 0, "span", "ckpt.load", 0), ev(1, 0, "mark", "ready", 2),
        ev(2, 1, "span", "ckpt.load", 0), ev(2, 1, "mark", "ready", 3)]) + "\n")
    (v,) = attempts(load.load(tmp_path / "job").events)
    assert v.nodes[0].ready == pytest.approx(3.0) and v.nodes[0].last_rank == 1
    # ckpt.load covers [0, 1] on both ranks; the rest of the 3 s before ready is untraced
    assert v.nodes[0].phases[UNTRACED] == pytest.approx(2.0)
    with open(d / "h-1.jsonl", "a") as fh:   # a helper of rank 1 (a mount's server, its
        fh.write(json.dumps(ev(4, 1, "span", "ckpt.load", 0)) + "\n")  # env's RANK=1)
    (v,) = attempts(load.load(tmp_path / "job").events)
    assert v.nodes[0].ready == pytest.approx(3.0) and not v.nodes[0].missing_ranks
    with open(d / "h-1.jsonl", "a") as fh:   # rank 2 was killed before ready
        fh.write(json.dumps(ev(3, 2, "span", "ckpt.load", 0)) + "\n")
    (v,) = attempts(load.load(tmp_path / "job").events)
    assert v.nodes[0].ready is None and v.nodes[0].missing_ranks == [2]


def test_settings_from_config_file_and_bad_values(tmp_path, monkeypatch):
    from bootseer.trace.record import Recorder
    toml = tmp_path / "c.toml"
    toml.write_text(f'[trace]\nlocation = "{tmp_path / "t"}"\njob_id = "j1"\ngpus = 8\n')
    r = Recorder.from_env({"BOOTSEER_CONFIG": str(toml), "BOOTSEER_TRACE_ATTEMPT": "2",
                           "BOOTSEER_TRACE_NODE": "n{local_rank}", "LOCAL_RANK": "3", "RANK": "7"})
    assert (r.location, r.job, r.attempt, r.gpus, r.node, r.rank) == \
        (str(tmp_path / "t"), "j1", 2, 8, "n3", 7)
    # a broken setting elsewhere never fails the traced job: the trace variables still apply
    r = Recorder.from_env({"BOOTSEER_FETCH_RETRIES": "many", "BOOTSEER_TRACE_LOCATION": "/x",
                           "BOOTSEER_TRACE_GPUS": "4"})
    assert r.enabled and r.location == "/x" and r.gpus == 4


def test_per_rank_node_name_without_rank_is_not_traced():
    from bootseer.trace.record import Recorder
    r = Recorder.from_env({"BOOTSEER_TRACE_LOCATION": "/x", "BOOTSEER_TRACE_NODE": "n{local_rank}"})
    assert not r.enabled   # the torchrun agent: would be a node that never gets ready
    r = Recorder.from_env({"BOOTSEER_TRACE_LOCATION": "/x", "BOOTSEER_TRACE_NODE": "n{local_rank}",
                           "LOCAL_RANK": "0"})
    assert r.enabled and r.node == "n0"


def _event_line(node: str, phase: str, at: float, kind: str = "span") -> str:
    return json.dumps({"v": 1, "job": "job", "attempt": 0, "node": node, "gpus": 8,
                       "kind": kind, "phase": phase, "start": 1000.0 + at,
                       "end": 1000.0 + at + (kind == "span")})


@pytest.mark.slow
def test_a_line_is_one_event_torn_and_blank_lines_cost_nothing_else(tmp_path):
    """A line holding two JSON objects is a bad line, not two events (in a small file read
    at once and in a large one read line by line); a torn last line (a node killed
    mid-write) costs only itself; blank lines are nothing. Each bad line is a one-line
    warning naming file:line, in the report too, never a traceback."""
    d = tmp_path / "job/0"
    d.mkdir(parents=True)
    (d / "a-1.jsonl").write_text("\n".join([
        _event_line("a", "p1", 0), f"{_event_line('a', 'p2', 1)}, {_event_line('a', 'p3', 2)}",
        _event_line("a", "ready", 5, "mark")]) + "\n")
    (d / "b-1.jsonl").write_text("\n" + _event_line("b", "q1", 0) + "\n\n  \n"
                                 + _event_line("b", "ready", 5, "mark") + "\n"
                                 + '{"v": 1, "job": "job", "attempt": 0, "node": "b", "pha')
    filler = [_event_line("c", f"f{i}", i / 1000) for i in range(9000)]   # > 1 MiB
    filler[10] = f"{_event_line('c', 'x1', 0)},{_event_line('c', 'x2', 0)}"
    (d / "c-1.jsonl").write_text("\n".join(filler + [_event_line("c", "ready", 9, "mark")])
                                 + "\n")
    assert (d / "c-1.jsonl").stat().st_size > load.MAX_LINE
    t = load.load(tmp_path / "job")
    phases = {(e["node"], e["phase"]) for e in t.events}
    assert {("a", "p1"), ("a", "ready"), ("b", "q1"), ("b", "ready"), ("c", "ready")} <= phases
    assert not phases & {("a", "p2"), ("a", "p3"), ("c", "x1"), ("c", "x2")}
    assert len(t.events) == 4 + 9000 and t.skipped_lines == 3
    said = [p for p in t.problems if ".jsonl:" in p]
    assert any(p.startswith("0/a-1.jsonl:2: ") for p in said), said
    assert any(p.startswith("0/b-1.jsonl:6: ") and "torn" in p for p in said), said
    assert any(p.startswith("0/c-1.jsonl:11: ") for p in said), said
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "job")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "warning: 0/a-1.jsonl:2: " in r.stdout and "Traceback" not in r.stderr
