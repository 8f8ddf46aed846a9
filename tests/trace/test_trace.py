"""Recording and reporting: the API, crash-torn files, killed nodes, the report forms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from bootseer.trace import analysis, load, record

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
    assert by["deps.restore"]["status"] == "failed" and "boom" in by["deps.restore"]["attrs"]["error"]
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


def test_report_names_gating_node_stragglers_and_killed(tmp_path):
    for i in range(6):
        slow = 30.0 if i == 4 else 0.0
        write_node(tmp_path, f"n{i}", [("image.pull", 0, 10 + slow + i * 0.1),
                                       ("deps.install", 0, 5 + i * 0.1)], 12 + slow + i * 0.1,
                   torn=(i == 1))
    write_node(tmp_path, "n9", [("image.pull", 0, 3)], None)   # killed during startup
    t = load.load(tmp_path / "job")
    assert t.skipped_lines == 1
    (v,) = analysis.attempts(t.events)
    s = analysis.summarize(v)
    assert s.time_to_ready is None and s.not_ready == ["n9"]
    assert s.gating_node == "n4" and s.gating_phase == "image.pull" and s.stragglers == ["n4"]
    assert s.what_if == pytest.approx(12.5, abs=0.6)
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "job"),
                        "--html", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json"),
                        "--chrome", str(tmp_path / "c.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "NOT READY: n9" in r.stdout and "gated by n4, phase image.pull" in r.stdout
    assert "skipped 1 unreadable line" in r.stdout
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert json.loads((tmp_path / "c.json").read_text())["traceEvents"]
    assert json.loads((tmp_path / "r.json").read_text())[0]["gating_node"] == "n4"


def test_clock_alignment_on_rendezvous(tmp_path):
    write_node(tmp_path, "a", [("x", 0, 5)], 6, rdzv=2)
    write_node(tmp_path, "b", [("x", 0, 5)], 6, rdzv=2, skew=100.0)  # clock 100 s ahead
    (v,) = analysis.attempts(load.load(tmp_path / "job").events)
    s = analysis.summarize(v)
    assert s.alignment == "rendezvous marks" and s.time_to_ready == pytest.approx(6.0)


def test_compare_and_gpu_seconds(tmp_path):
    write_node(tmp_path / "base", "a", [("image.pull", 0, 40)], 50, gpus=8)
    write_node(tmp_path / "new", "a", [("image.pull", 0, 10)], 20, gpus=8)
    write_node(tmp_path / "new", "a", [("image.pull", 0, 8)], 18, gpus=8, attempt=1)
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "new/job"),
                        "--baseline", str(tmp_path / "base/job")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "restarts: 1" in r.stdout and "GPU-seconds lost in all: 304" in r.stdout
    assert ["TIME", "TO", "READY", "50.0", "18.0", "64%"] in [l.split() for l in r.stdout.splitlines()]


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
    r = subprocess.run([sys.executable, "-m", "bootseer", "trace", "exec", "--phase", "deps.install",
                        "--", "sh", "-c", "exit 3"], env=env)
    assert r.returncode == 3
    ev = load.load(tmp_path).events
    assert ev[0]["phase"] == "deps.install" and ev[0]["attrs"]["exit"] == 3


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
