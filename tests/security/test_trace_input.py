"""Trace ids and trace input are untrusted (issue 18, item 17b-d): ids never name a path
outside the trace location; readers open regular files only, cap line length, and reject
events with NaN, infinite or huge numbers, counting each instead of hanging, running out
of memory or printing ``-inf``."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.report import load

pytestmark = pytest.mark.timeout(120)


def _event(node: str, phase: str, start, end, **extra) -> dict:
    return {"v": 1, "job": "job", "attempt": 0, "node": node, "gpus": 8, "kind": "span",
            "phase": phase, "parent": None, "start": start, "end": end, "status": "ok",
            "attrs": {}, **extra}


def _good_node(d: Path, node: str = "n0") -> None:
    d.mkdir(parents=True, exist_ok=True)
    lines = [_event(node, "image.pull", 1000.0, 1010.0),
             {**_event(node, "ready", 1012.0, 1012.0), "kind": "mark"}]
    (d / f"{node}-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _report(trace_dir: Path) -> subprocess.CompletedProcess:
    """`bootseer report` in a child with a 1 GiB address-space cap and a timeout: a reader
    that blocks or reads without end fails the test instead of the machine."""
    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    return subprocess.run([sys.executable, "-m", "bootseer", "report", str(trace_dir)],
                          capture_output=True, text=True, timeout=60, preexec_fn=cap_memory)


# -- 17b: ids ----------------------------------------------------------------------------------
@pytest.mark.parametrize("var, value", [("BOOTSEER_TRACE_JOB_ID", "../x"),
                                        ("BOOTSEER_TRACE_NODE", "../../x"),
                                        ("BOOTSEER_TRACE_JOB_ID", ".."),
                                        ("BOOTSEER_TRACE_NODE", "a/b")])
def test_a_trace_id_that_is_a_path_is_one_error_line(tmp_path, var, value):
    env = {**os.environ, "BOOTSEER_TRACE_LOCATION": str(tmp_path / "t" / "loc"), var: value}
    r = subprocess.run([sys.executable, "-m", "bootseer", "run", "--", "true"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0
    assert r.stderr.startswith("bootseer: error:") and var in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not any(p.suffix == ".jsonl" for p in tmp_path.rglob("*"))


def test_the_recorder_in_a_job_never_writes_outside_the_location(tmp_path):
    """The traced job's own recorder (raw variables, no bootseer command in front): it
    warns once and does not trace; the job itself is not failed."""
    loc = tmp_path / "a" / "b" / "loc"
    env = {**os.environ, "BOOTSEER_TRACE_LOCATION": str(loc),
           "BOOTSEER_TRACE_JOB_ID": "../../escape", "BOOTSEER_TRACE_NODE": "../../../n"}
    r = subprocess.run([sys.executable, "-c", "from bootseer import trace\n"
                        "with trace.phase('x'):\n    pass\nprint('job ran')"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "job ran" in r.stdout
    assert "not tracing" in r.stderr and "Traceback" not in r.stderr
    assert not any(p.suffix == ".jsonl" for p in tmp_path.rglob("*"))


def test_node_name_templates_and_ordinary_ids_still_work(tmp_path, monkeypatch):
    from bootseer.config import BootseerConfig
    from bootseer.trace.record import Recorder
    monkeypatch.setenv("BOOTSEER_TRACE_NODE", "n{local_rank}")
    assert BootseerConfig.from_env().trace.node == "n{local_rank}"
    r = Recorder(str(tmp_path), "job-1_2.x", 0, "node-7.cluster", None, 8)
    assert r.enabled and r.path.startswith(str(tmp_path / "job-1_2.x" / "0" / "node-7.cluster"))


# -- 17c: what is not a regular file ------------------------------------------------------------
def test_fifo_and_device_links_in_a_trace_are_skipped_and_counted(tmp_path):
    job = tmp_path / "job" / "0"
    _good_node(job)
    os.mkfifo(job / "fifo.jsonl")                  # a reader would block forever
    os.symlink("/dev/zero", job / "zero.jsonl")    # ...or read until out of memory
    os.symlink(job / "n0-1.jsonl", job / "link.jsonl")   # a link, even to a good file
    t = load.load(tmp_path / "job")
    assert t.skipped_files == 3 and len(t.events) == 2
    assert any("3 trace file(s) that are not regular" in p for p in t.problems)
    r = _report(tmp_path / "job")
    assert r.returncode == 0, r.stderr
    assert "not regular files" in r.stdout + r.stderr


def test_a_named_fifo_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "t.jsonl")
    t = load.load(tmp_path / "t.jsonl")
    assert t.skipped_files == 1 and not t.events


def test_a_huge_line_is_skipped_without_holding_it(tmp_path):
    job = tmp_path / "job" / "0"
    _good_node(job)
    with open(job / "n1-1.jsonl", "wb") as f:
        f.write(b'{"pad": "' + b"x" * (3 * load.MAX_LINE) + b'"}\n')
        f.write(json.dumps(_event("n1", "image.pull", 1000.0, 1011.0)).encode() + b"\n")
        f.write(b"y" * (2 * load.MAX_LINE))          # and a long last line without newline
    t = load.load(tmp_path / "job")
    assert t.long_lines == 2 and t.skipped_lines == 2
    assert {e["node"] for e in t.events} == {"n0", "n1"}
    assert any("longer than" in p for p in t.problems)


def test_read_lines_caps_at_any_chunk_boundary(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"a\n" + b"b" * 10 + b"\n" + b"c" * 4 + b"\nd")
    lines, long_lines = load.read_lines(os.open(f, os.O_RDONLY), max_line=5)
    assert lines == [b"a", b"cccc", b"d"] and long_lines == 1


# -- 17d: numbers -------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [
    '"start": NaN, "end": 1010.0',
    '"start": 1000.0, "end": Infinity',
    '"start": -Infinity, "end": 1010.0',
    '"start": 1000.0, "end": 1e400',
    '"start": 1000.0, "end": 1' + "0" * 400,
    '"start": 1000.0, "end": 1010.0, "gpus": 1' + "0" * 40,
    '"start": 1000.0, "end": 1010.0, "attrs": {"bytes": 1e999}',
])
def test_events_with_bad_numbers_are_rejected_and_counted(tmp_path, bad):
    job = tmp_path / "job" / "0"
    _good_node(job)
    line = ('{"v": 1, "job": "job", "attempt": 0, "node": "n1", "kind": "span", '
            '"phase": "image.pull", "parent": null, "status": "ok", ' + bad + "}\n")
    if '"gpus"' not in bad:
        line = line.replace('"kind"', '"gpus": 8, "kind"')
    (job / "n1-1.jsonl").write_text(line)
    t = load.load(tmp_path / "job")
    assert t.rejected == 1 and [e["node"] for e in t.events] == ["n0", "n0"]
    assert any("rejected 1 event(s)" in p for p in t.problems)
    r = _report(tmp_path / "job")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    figures = "\n".join(ln for ln in r.stdout.splitlines() if "rejected" not in ln)
    assert not re.search(r"(?<![a-z])-?(inf|nan)(?![a-z])", figures.lower()), figures
    assert "rejected 1 event(s)" in r.stdout + r.stderr


def test_an_event_is_malformed_before_it_is_out_of_range_whatever_its_order():
    """A wrong type anywhere makes an event malformed, even after an out-of-range number
    (the check is one pass over the event's own fields, in their order)."""
    good = {"job": "j", "attempt": 0, "node": "n", "phase": "p", "start": 1.0, "end": 2.0}
    assert load._check(good) == load._GOOD
    assert load._check({**good, "start": float("nan")}) == load._OUT_OF_RANGE
    rest = {k: v for k, v in good.items() if k != "start"}
    assert load._check({"start": float("nan"), **rest, "pid": "7"}) == load._MALFORMED
    assert load._check({"gpus": 1 << 70, **good, "rank": True}) == load._MALFORMED
    assert load._check({**good, "node": None}) == load._MALFORMED   # required
    assert load._check({**good, "rank": None, "extra": [1]}) == load._GOOD   # optional, unknown
    assert load._check({**good, "attrs": {"b": float("inf")}}) == load._OUT_OF_RANGE


def test_cluster_reader_refuses_bad_numbers_and_non_regular_files(tmp_path):
    from bootseer.report import cluster
    good = {"kind": "attempt", "job": "j", "attempt": 0, "gpus": 8, "nodes": 1, "t": 0.0,
            "ready": 30.0, "train": 600.0, "phases": {}, "gating_node": "n0",
            "gating_phase": "image.pull"}
    (tmp_path / "cluster.jsonl").write_text(
        json.dumps(good) + "\n" + json.dumps(good).replace("30.0", "NaN") + "\n"
        + json.dumps(good).replace("600.0", "1e400") + "\n")
    recs, notes = cluster.read_attempts(tmp_path)
    assert len(recs) == 1 and any("skipped 2" in n for n in notes)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "cluster.jsonl")   # not a file: never opened, counted
    recs, notes = cluster.read_attempts(fifo)
    assert recs == [] and any("not regular files" in n for n in notes)


def test_a_trace_url_copies_regular_files_only(tmp_path):
    """`report file://DIR` copies the trace first: a FIFO or a device there is not copied
    (the copy would block, or fill the disk)."""
    job = tmp_path / "job" / "0"
    _good_node(job)
    os.mkfifo(job / "fifo.jsonl")
    os.symlink("/dev/zero", job / "zero.jsonl")
    r = _report_url(f"file://{tmp_path / 'job'}")
    assert r.returncode == 0 and "attempts: 1" in r.stdout, r.stderr


def _report_url(url: str) -> subprocess.CompletedProcess:
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
    return subprocess.run([sys.executable, "-m", "bootseer", "report", url], capture_output=True,
                          text=True, timeout=60, preexec_fn=cap)
