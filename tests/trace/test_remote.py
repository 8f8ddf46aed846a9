"""``--trace URL``: a store location is recorded to a spool, uploaded as blobs + refs
``traces/<job>/<attempt>/<file>``, and read back by ``bootseer report URL``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bootseer.report import remote
from bootseer.store import open_store

pytestmark = pytest.mark.timeout(120)


def _bootseer(*args, env=None):
    return subprocess.run([sys.executable, "-m", "bootseer", *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def _traced_run(url, tmp_path, job="j1", attempt=0, node="n1"):
    """A start traced to ``url`` whose job marks ready (the job's own recorder)."""
    ready = "from bootseer import trace; trace.mark('ready')"
    return _bootseer("run", "--trace", url, "--job-id", job, "--attempt", attempt,
                     "--node", node, "--", sys.executable, "-c", ready,
                     env={"BOOTSEER_CACHE_DIR": str(tmp_path / "cache"),
                          "XDG_CACHE_HOME": str(tmp_path / "xdg")})


def test_a_directory_store_gets_refs_and_report_reads_them(tmp_path):
    store_dir = tmp_path / "store"
    url = f"file://{store_dir}"
    for attempt, node in ((0, "n1"), (0, "n2"), (1, "n1")):
        r = _traced_run(url, tmp_path, attempt=attempt, node=node)
        assert r.returncode == 0, r.stderr
    refs = sorted(p.relative_to(store_dir / "refs").as_posix()
                  for p in (store_dir / "refs" / "traces").rglob("*.jsonl"))
    # a file per process: bootseer run's and the job's own
    assert [r.rsplit("/", 1)[0] for r in refs] == ["traces/j1/0"] * 4 + ["traces/j1/1"] * 2
    spools = [p for p in tmp_path.rglob("trace-spool/*") if p.is_dir()]
    assert spools == [], spools            # uploaded, then removed
    for args in ([url], [url, "--job", "j1"], [f"{url}/j1"]):
        r = _bootseer("report", *args)
        assert r.returncode == 0, (args, r.stderr)
        assert "attempt 0: 2 nodes" in r.stdout and "attempt 1: 1 nodes" in r.stdout, r.stdout
        assert "NOT READY" not in r.stdout
    r = _bootseer("report", url, "--job", "other")
    assert r.returncode == 1 and "no trace of job other (jobs: j1)" in r.stderr
    r = _bootseer("analyze", url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("1 jobs, 2 attempts") and "1 job(s) restarted" in r.stdout


def test_a_registry_store(registry, tmp_path):
    url = f"oci://127.0.0.1:{registry.port}/bootseer/traces"
    assert _traced_run(url, tmp_path, job="job-7", node="node:a@1").returncode == 0
    store = open_store(url)
    try:
        assert remote.jobs(store) == ["job-7"]
        names = list(store.list_refs("traces/job-7/0/"))
        # bootseer run's file and the job's; node:a@1 -> a safe part
        assert len(names) == 2 and all(n.endswith(".jsonl") for n in names), names
    finally:
        store.close()
    r = _bootseer("report", url, "--job", "job-7")
    assert r.returncode == 0, r.stderr
    assert "attempt 0: 1 nodes" in r.stdout and "node:a@1" in r.stdout


def test_each_flush_moves_the_ref_to_the_file_so_far(tmp_path):
    spool = tmp_path / "spool"
    trace_file = spool / "j" / "0" / "n1-1.jsonl"
    trace_file.parent.mkdir(parents=True)
    trace_file.write_text('{"a":1}\n')
    store = open_store(str(tmp_path / "store"))
    assert remote.upload(store, spool) == 1
    assert remote.upload(store, spool) == 0            # unchanged: nothing sent
    with trace_file.open("a") as f:
        f.write('{"a":2}\n')
    assert remote.upload(store, spool) == 1
    assert store.read(store.get_ref("traces/j/0/n1-1.jsonl")) == trace_file.read_bytes()


def test_ref_parts_are_plain_and_distinct():
    for text in ("n1", "job-7", "n1-0cca434a-27945.jsonl"):
        assert remote.ref_part(text) == text
    odd = ["node:a@1", "a--b", "x" * 60, ".hidden", "x" * 61]
    parts = [remote.ref_part(t) for t in odd]
    assert len(set(parts)) == len(parts)
    from bootseer.store.backends.oci import ref_to_tag
    for p in parts:   # listable back from a registry: a reversible tag
        assert ref_to_tag(f"traces/{p}/0/{p}").startswith("ref."), p


def test_an_unwritable_location_fails_before_the_job_starts(tmp_path):
    marker = tmp_path / "started"
    r = _bootseer("run", "--trace", "http://user:pw@127.0.0.1:9/t", "--", "touch", marker)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "cannot record traces to" in r.stderr and "read-only" in r.stderr
    assert "pw" not in r.stderr and not marker.exists()


def test_trace_exec_uploads_to_a_store_url(tmp_path):
    """``trace exec --location URL`` records the command (and what it traces itself) to a
    spool and uploads it at its end, as ``bootseer run --trace URL`` does."""
    store_dir = tmp_path / "store"
    url = f"file://{store_dir}"
    env = {"BOOTSEER_CACHE_DIR": str(tmp_path / "cache"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "BOOTSEER_TRACE_JOB_ID": "j2", "BOOTSEER_TRACE_NODE": "n1"}
    ready = "from bootseer import trace; trace.mark('ready')"
    for phase in ("deps.install", "image.pull"):   # two commands: two files, none replaced
        r = _bootseer("trace", "exec", "--phase", phase, "--location", url, "--",
                      sys.executable, "-c", ready, env=env)
        assert r.returncode == 0 and r.stderr == "", r.stderr
    r = _bootseer("trace", "mark", "ready", "--location", url, env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    names = sorted(p.name for p in (store_dir / "refs" / "traces" / "j2" / "0").iterdir())
    assert len(names) == 5, names                 # each exec's and its command's, the mark's
    assert [p for p in tmp_path.rglob("trace-spool/*") if p.is_dir()] == []
    r = _bootseer("report", url, "--job", "j2", "--json", "-")
    assert r.returncode == 0, r.stderr
    assert {"deps.install", "image.pull"} <= set(json.loads(r.stdout)["attempts"][0]["phases"])


def test_trace_exec_without_a_location_says_so(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("BOOTSEER_TRACE_") and k != "BOOTSEER_CONFIG"}
    env["XDG_CONFIG_HOME"] = str(tmp_path)         # no config file sets a location either
    marker = tmp_path / "ran"
    r = subprocess.run([sys.executable, "-m", "bootseer", "trace", "exec", "--phase", "x", "--",
                        "touch", str(marker)], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and marker.exists()       # the command runs all the same
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("bootseer: warning: "), r.stderr
    assert "not recorded" in r.stderr and "--trace" in r.stderr \
        and "BOOTSEER_TRACE_LOCATION" in r.stderr


def test_trace_exec_to_an_unwritable_store_fails_before_the_command(tmp_path):
    marker = tmp_path / "started"
    r = _bootseer("trace", "exec", "--phase", "x", "--location", "http://user:pw@127.0.0.1:9/t",
                  "--", "touch", marker, env={"BOOTSEER_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "cannot record traces to" in r.stderr and "pw" not in r.stderr
    assert not marker.exists()
