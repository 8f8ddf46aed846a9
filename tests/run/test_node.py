"""``bootseer run`` end to end on the conventional path (real registry, podman, nginx, pip)
and its fault handling: missing command, SIGTERM during startup, failing pipelines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer.demo.assets import write_simple_index
from tests.conftest import is_root, need
from tests.run.test_baseline import make_wheel

pytestmark = pytest.mark.timeout(240)


def bootseer(*args, **kw):
    return subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                          text=True, **kw)


@pytest.fixture
def index(nginx_factory, tmp_path):
    root = tmp_path / "index"
    (root / "wheels").mkdir(parents=True)
    make_wheel(root / "wheels", "bsrun_beta", "2.0", "NAME = 'beta'\n")
    write_simple_index(root)
    server = nginx_factory(root)
    spec = tmp_path / "requirements.txt"
    spec.write_text("bsrun-beta==2.0\n")
    return f"{server.url}/simple", spec


@pytest.fixture
def ckpt_dir(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "shard0.bin").write_bytes(os.urandom(300_000))
    (d / ".metadata").write_bytes(b"meta")
    return d


def test_host_mode_all_conventional_pipelines(index, ckpt_dir, nginx_factory, tmp_path):
    index_url, spec = index
    ck = nginx_factory(ckpt_dir)
    summary = tmp_path / "summary.json"
    script = ('import os, bsrun_beta; d = os.environ["BOOTSEER_CKPT_DIR"]; '
              'assert sorted(os.listdir(d)) == [".metadata", "shard0.bin"], os.listdir(d); '
              'open(os.environ["BOOTSEER_READY_FILE"], "w").close(); '
              'print("ok", bsrun_beta.NAME, os.environ["BOOTSEER_ENV_PREFIX"] != "")')
    prefix = tmp_path / "env"
    r = bootseer("run", "--baseline", "--deps", str(spec), "--prefix", str(prefix),
                 "--index-url", index_url, "--ckpt", f"{ck.url}/", "--summary", str(summary),
                 "--", str(prefix / "bin/python"), "-c", script)
    assert r.returncode == 0, r.stderr
    assert "ok beta True" in r.stdout
    data = json.loads(summary.read_text())
    assert {"deps.install", "ckpt.fetch", "job.run", "ready"} <= set(data["phases"])
    # overlapped: both pipelines started before either ended
    d, c = data["phases"]["deps.install"], data["phases"]["ckpt.fetch"]
    assert d["start"] < c["end"] and c["start"] < d["end"]
    assert data["ready_s"] is not None and data["phases"]["ckpt.fetch"]["bytes"] == 300_004


@pytest.mark.slow
def test_exit_status_and_missing_command_on_host():
    assert bootseer("run", "--", sys.executable, "-c", "raise SystemExit(9)").returncode == 9
    r = bootseer("run", "--", "no-such-command-bootseer")
    assert r.returncode == 127 and "not found" in r.stderr
    r = bootseer("run")
    assert r.returncode == 2 and "no command given" in r.stderr   # usage (docs/cli.md)


@pytest.mark.slow
def test_ready_at_the_first_output_line_matching_the_regex(tmp_path):
    """--ready-regex: the job is ready at the matching line (a job that cannot create the
    ready file); every line still reaches our stdout/stderr, in order, and the status
    passes through."""
    summary = tmp_path / "s.json"
    code = ("import sys, time; print('loading', flush=True); time.sleep(0.5); "
            "print('step 1 loss=3.1', flush=True); print('warn', file=sys.stderr, flush=True); "
            "time.sleep(0.5); print('step 2', flush=True); raise SystemExit(4)")
    r = bootseer("run", "--summary", str(summary), "--ready-regex", r"^step \d+ ", "--",
                 sys.executable, "-c", code)
    assert r.returncode == 4, r.stderr
    assert r.stdout.splitlines() == ["loading", "step 1 loss=3.1", "step 2"]
    assert "warn" in r.stderr
    data = json.loads(summary.read_text())
    # ready at "step 1" (after ~0.5 s), not at the end (~1 s)
    assert data["ready_s"] is not None
    assert data["ready_s"] < data["phases"]["job.run"]["end"] - 0.2
    r = bootseer("run", "--ready-regex", "(", "--", "true")
    assert r.returncode == 2 and "--ready-regex" in r.stderr   # usage (docs/cli.md)


def test_failed_pipeline_is_a_clear_error(index, tmp_path):
    index_url, spec = index
    spec.write_text("bsrun-beta==7.7\n")
    r = bootseer("run", "--no-snapshot", "--deps", str(spec), "--prefix", str(tmp_path / "e"),
                 "--index-url", index_url, "--", "true")
    assert r.returncode == 1
    assert "deps pipeline failed" in r.stderr and "bsrun-beta==7.7" in r.stderr


def test_sigterm_during_startup_leaves_nothing(nginx_factory, tmp_path):
    big = tmp_path / "slow"
    big.mkdir()
    (big / "blob").write_bytes(os.urandom(4_000_000))
    slow = nginx_factory(big, limit_rate="100k")   # ~40 s to read: still preparing
    proc = subprocess.Popen([sys.executable, "-m", "bootseer", "run", "--no-stripe",
                             "--ckpt", f"{slow.url}/", "--", "true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.5)
    mine = []   # this run's state (others' runs may be going on on this machine)
    for p in os.listdir("/tmp"):
        try:
            if p.startswith("bsn-") and _holder(f"/tmp/{p}/.alive") == proc.pid:
                mine.append(p)
        except OSError:
            pass
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert mine and not [p for p in mine if os.path.exists(f"/tmp/{p}")], "node state left behind"
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    assert children.stdout.strip() == ""


@pytest.mark.root
def test_pulled_image_run_passes_status_and_127(registry, busybox_rootfs, tmp_path):
    need(is_root(), "containers need root")
    from tests.run.test_baseline import push_busybox
    ref = push_busybox(registry, busybox_rootfs, tmp_path)
    r = bootseer("run", "--pull", "--image", ref, "--", "sh", "-c",
                 "touch $BOOTSEER_READY_FILE; exit 4")
    assert r.returncode == 4, r.stderr
    r = bootseer("run", "--pull", "--image", ref, "--", "python3", "-c", "pass")
    assert r.returncode == 127
    assert "'python3' not found in image" in r.stderr


@pytest.mark.fuse
def test_checkpoint_staged_before_the_command_is_read_locally(index, ckpt_dir, nginx_factory,
                                                              tmp_path):
    """Striped checkpoint + snapshot pipelines: the checkpoint's prefetch finishes while the
    environment is built, so the command gets the staged files (hard links), not FUSE."""
    need(is_root(), "FUSE mounts need root")
    index_url, spec = index
    ck = nginx_factory(ckpt_dir)
    script = ('import os; d = os.environ["BOOTSEER_CKPT_DIR"]; '
              'print("dir", d, os.path.ismount(d)); '
              'print("bytes", open(os.path.join(d, "shard0.bin"), "rb").read() == '
              f'open({str(ckpt_dir / "shard0.bin")!r}, "rb").read())')
    env = {**os.environ, "BOOTSEER_STORE_URL": str(tmp_path / "store"),
           "BOOTSEER_CACHE_DIR": str(tmp_path / "node" / "cache")}
    r = bootseer("run", "--deps", str(spec), "--prefix", str(tmp_path / "env"),
                 "--index-url", index_url, "--ckpt", f"{ck.url}/", "--",
                 sys.executable, "-c", script, env=env)
    assert r.returncode == 0, r.stderr
    assert "bytes True" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("dir "))
    assert "mirror-" in line and line.endswith("False"), line
    assert not list((tmp_path / "node" / "ckpt").glob("mirror-*")), "mirror left behind"


@pytest.mark.fuse
def test_checkpoint_mirror_is_passed_to_the_striped_pipeline(index, ckpt_dir, nginx_factory,
                                                             tmp_path):
    """--ckpt-mirror reaches the checkpoint mount: an exact copy serves the load; a copy
    whose files differ is refused before the command starts, naming the mirror."""
    need(is_root(), "FUSE mounts need root")
    index_url, spec = index
    primary = nginx_factory(ckpt_dir)
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in ckpt_dir.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
        os.utime(copy / p.name, (p.stat().st_atime, p.stat().st_mtime))
    mirror = nginx_factory(copy)
    env = {**os.environ, "BOOTSEER_STORE_URL": str(tmp_path / "store"),
           "BOOTSEER_CACHE_DIR": str(tmp_path / "node" / "cache")}
    script = ('import os; d = os.environ["BOOTSEER_CKPT_DIR"]; '
              'print("bytes", open(os.path.join(d, "shard0.bin"), "rb").read() == '
              f'open({str(ckpt_dir / "shard0.bin")!r}, "rb").read())')
    r = bootseer("run", "--deps", str(spec), "--prefix", str(tmp_path / "env"),
                 "--index-url", index_url, "--ckpt", f"{primary.url}/", "--ckpt-mirror",
                 f"{mirror.url}/", "--", sys.executable, "-c", script, env=env)
    assert r.returncode == 0, r.stderr
    assert "bytes True" in r.stdout
    (copy / "shard0.bin").write_bytes(os.urandom(1000))      # no longer a copy
    r = bootseer("run", "--deps", str(spec), "--prefix", str(tmp_path / "env"),
                 "--index-url", index_url, "--ckpt", f"{primary.url}/", "--ckpt-mirror",
                 f"{mirror.url}/", "--", sys.executable, "-c", script, env=env)
    assert r.returncode != 0 and mirror.url in r.stderr, r.stderr


def test_state_left_by_a_killed_node_run_is_swept_by_the_next(tmp_path):
    """A node run killed with SIGKILL cannot clean up; the next run on the node removes
    its state directory, never a live run's (that one holds the lock on its .alive)."""
    from bootseer.run.node import ALIVE, STATE_PREFIX, sweep_dead_states
    p = subprocess.Popen([sys.executable, "-m", "bootseer", "run", "--", "sleep", "30"])
    children: list[str] = []
    try:
        deadline = time.time() + 30
        mine = []
        while not mine and time.time() < deadline:
            mine = [d for d in Path("/tmp").glob(f"{STATE_PREFIX}*") if (d / ALIVE).exists()
                    and _holder(d / ALIVE) == p.pid]
            time.sleep(0.05)
        assert mine, "the run's state directory did not appear"
        assert str(mine[0]) not in sweep_dead_states()    # alive: kept
        children = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                  text=True).stdout.split()
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert str(mine[0]) in sweep_dead_states() and not mine[0].exists()
    finally:
        if p.poll() is None:
            p.kill()
        for child in children:   # the command outlives a SIGKILLed run
            subprocess.run(["kill", child])


def _holder(path) -> int | None:
    """The pid holding a flock (bootseer.node.alive marks) on ``path`` (from /proc/locks),
    if any."""
    ino = os.stat(path).st_ino
    for line in open("/proc/locks"):
        f = line.split()
        if f[1] == "FLOCK" and f[5].split(":")[-1] == str(ino):
            return int(f[4])
    return None
