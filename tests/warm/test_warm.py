"""Warm starts with real processes: a zygote, launchers, cold execs, signals, two uids."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SRC = str(Path(__file__).resolve().parents[2] / "src")
SCRIPT = """\
import json, email.parser, decimal, os, sys, time
if os.environ.get("SLEEP"):
    print("ready", flush=True)
    time.sleep(float(os.environ["SLEEP"]))
print(json.dumps({"rank": os.environ.get("RANK"), "argv": sys.argv, "cwd": os.getcwd(),
                  "parent": os.getppid(), "file": __file__, "name": __name__}))
sys.exit(int(os.environ.get("CODE", "0")))
"""


@pytest.fixture
def job(tmp_path):
    work = tmp_path / "job"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    (work / "conf.yaml").write_text("lr: 1\n")
    env = {**os.environ, "PYTHONPATH": f"{SRC}:{work}", "BOOTSEER_WARM_DIR": str(tmp_path / "w"),
           "BOOTSEER_WARM_TIMEOUT_S": "3"}
    env.pop("BOOTSEER_TRACE_LOCATION", None)
    started: list[subprocess.Popen] = []

    def zygote(*modules: str, idle: float = 30) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-m", "bootseer.warm.zygote", "--modules",
                              ",".join(modules or ("json", "email.parser", "decimal")),
                              "--idle", str(idle), "--", "train.py", "conf.yaml"],
                             cwd=work, env=env, stderr=subprocess.PIPE, text=True)
        started.append(p)
        assert _ready(p)
        return p

    def worker(extra: dict | None = None, cold: bool = False, **kw) -> subprocess.Popen:
        head = [sys.executable] if cold else [sys.executable, "-m", "bootseer.warm.worker", "--"]
        return subprocess.Popen([*head, "train.py", "conf.yaml"], cwd=work,
                                env={**env, "RANK": "3", **(extra or {})}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)

    yield work, env, zygote, worker
    for p in started:
        if p.poll() is None:
            p.terminate()
            p.wait(10)


def _run(p: subprocess.Popen) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=20)
    return p.returncode, out, err


def test_hit_matches_cold_output_and_exit_code(job):
    _work, _env, zygote, worker = job
    z = zygote()
    for code in ("0", "5"):
        rc, out, err = _run(worker({"CODE": code}))
        crc, cout, _ = _run(worker({"CODE": code}, cold=True))
        assert "cold start" not in err
        assert rc == crc == int(code)
        hot, cold = __import__("json").loads(out), __import__("json").loads(cout)
        assert hot["parent"] == z.pid  # served by a fork of the zygote
        same = ("rank", "argv", "cwd", "file", "name")
        assert {k: hot[k] for k in same} == {k: cold[k] for k in same}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_signals_end_the_worker_as_cold(job, sig):
    _work, _env, zygote, worker = job
    zygote()
    results = []
    for cold in (False, True):
        p = worker({"SLEEP": "30"}, cold=cold)
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        if sig == signal.SIGKILL and not cold:
            os.kill(_served_child(p.pid), sig)  # the worker itself killed, not the launcher
        else:
            os.kill(p.pid, sig)
        rc, _out, err = _run(p)
        results.append(rc)
        assert cold or "cold start" not in err, err
        if sig == signal.SIGINT:
            assert "KeyboardInterrupt" in err
    assert results[0] == results[1] == -sig, err


def test_a_launcher_killed_takes_its_served_child_with_it(job):
    """A cold worker SIGKILLed is gone; so is the fork serving a launcher SIGKILLed (the
    signal cannot be relayed), not left running where the job cannot see it."""
    _work, _env, zygote, worker = job
    zygote()
    p = worker({"SLEEP": "30"})
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    child = _served_child(p.pid)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    for _ in range(100):
        if not os.path.exists(f"/proc/{child}"):
            break
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}")


def _served_child(launcher: int) -> int:
    """The zygote's child serving ``launcher`` (same stdout pipe as the launcher)."""
    target = os.readlink(f"/proc/{launcher}/fd/1")
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != launcher:
            try:
                if os.readlink(f"/proc/{pid}/fd/1") == target:
                    return int(pid)
            except OSError:
                continue
    raise AssertionError("no served child")


@pytest.mark.parametrize("module,why", [
    ("startthread", "a thread was started"),
    ("opensocket", "a socket is open"),
    ("startchild", "child process"),
])
def test_unsafe_zygote_is_never_forked_from(job, module, why):
    work, _env, zygote, worker = job
    (work / "startthread.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    (work / "opensocket.py").write_text("import socket\nS = socket.socket()\n")
    (work / "startchild.py").write_text(
        "import subprocess\nP = subprocess.Popen(['sleep', '2'])\n")
    z = zygote("json", module)
    rc, out, err = _run(worker())
    assert rc == 0 and f"unsafe to fork: {why}" in err and "cold start" in err
    assert __import__("json").loads(out)["parent"] != z.pid
    assert z.wait(10) == 0  # an unsafe zygote ends itself


def test_unsafe_zygote_still_reports_the_workers_it_served(job):
    work, _env, zygote, worker = job
    # on SIGUSR1 the zygote opens a socket: unsafe from then on
    (work / "lateopen.py").write_text(
        "import signal, socket\nHELD = []\n"
        "signal.signal(signal.SIGUSR1, lambda *_: HELD.append(socket.socket()))\n")
    z = zygote("json", "lateopen")
    running = worker({"SLEEP": "1", "CODE": "4"})
    assert running.stdout is not None and running.stdout.readline() == "ready\n"
    os.kill(z.pid, signal.SIGUSR1)
    rc, out, err = _run(worker())
    assert rc == 0 and "unsafe to fork: a socket is open" in err
    assert __import__("json").loads(out)["parent"] != z.pid
    rc, _out, err = _run(running)   # the worker it served still ends as it ended
    assert rc == 4 and "cold start" not in err and "status lost" not in err
    assert z.wait(10) == 0   # and then the zygote is gone


def test_bad_timeout_setting_is_one_line_and_cold(job):
    _work, _env, zygote, worker = job
    zygote()
    rc, _out, err = _run(worker({"BOOTSEER_WARM_TIMEOUT_S": "soon"}))
    assert rc == 0 and "BOOTSEER_WARM_TIMEOUT_S is not a number of seconds" in err


def test_changed_script_is_not_served_by_stale_zygote(job):
    work, _env, zygote, worker = job
    z = zygote()
    (work / "conf.yaml").write_text("lr: 2\n")
    rc, out, err = _run(worker())
    assert rc == 0 and "key differs: file.conf.yaml" in err
    assert __import__("json").loads(out)["parent"] != z.pid


def test_zygote_killed_mid_fork_falls_back_cold(job):
    _work, _env, zygote, worker = job
    z = zygote()
    os.kill(z.pid, signal.SIGSTOP)
    p = worker()
    time.sleep(0.5)  # the launcher has connected and waits for the answer
    os.kill(z.pid, signal.SIGKILL)
    rc, out, err = _run(p)
    assert rc == 0 and "cold start (zygote closed the connection" in err
    rc, out, err = _run(worker())  # the stale socket of the dead zygote: cold again
    assert rc == 0 and "cold start (zygote unreachable" in err


def test_nothing_left_running_after_the_job(job):
    work, env, zygote, worker = job
    z = zygote(idle=0.5)
    assert _run(worker())[0] == 0
    assert z.wait(10) == 0
    assert not list(Path(env["BOOTSEER_WARM_DIR"]).iterdir())  # socket removed


def test_bad_command_and_timeout_say_one_line(job):
    _work, env, _zygote, _worker = job
    p = subprocess.run([sys.executable, "-m", "bootseer.warm.worker", "--"], env=env,
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 2 and "hint:" in p.stderr


@pytest.mark.root
def test_another_uid_is_refused():
    if os.getuid() != 0:
        pytest.skip("needs root to act as another uid")
    # a python and directories the other user can reach; the zygote is root's
    py, shared = "/usr/bin/python3", Path(tempfile.mkdtemp(prefix="warm-uid-"))
    try:
        os.chmod(shared, 0o755)
        (shared / "train.py").write_text(SCRIPT)
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": SRC,
               "BOOTSEER_WARM_DIR": str(shared / "w")}
        z = subprocess.Popen([py, "-m", "bootseer.warm.zygote", "--idle", "30", "--", "train.py"],
                             cwd=shared, env=env, stderr=subprocess.PIPE, text=True)
        try:
            assert _ready(z)
            # the launcher of another user never uses this user's directory
            p = subprocess.run([py, "-m", "bootseer.warm.worker", "--", "train.py"], cwd=shared,
                               env=env, user=65534, capture_output=True, text=True, timeout=20)
            assert p.returncode == 0 and "not a 0700 directory of uid 65534" in p.stderr
            # and the zygote refuses a peer of another uid even if its socket were reachable
            os.chmod(shared / "w", 0o711)
            sock = next((shared / "w").iterdir())
            os.chmod(sock, 0o666)
            probe = ("import socket,sys;s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1]);"
                     "print(s.recv(4096).decode())")
            out = subprocess.run([py, "-c", probe, str(sock)], user=65534, capture_output=True,
                                 text=True, timeout=20).stdout
            assert "another user's zygote" in out
        finally:
            z.terminate()
            z.wait(10)
    finally:
        shutil.rmtree(shared)


def test_bootseer_run_warm_keeps_only_by_setting(job):
    work, env, _zygote, _worker = job
    wdir = Path(env["BOOTSEER_WARM_DIR"])

    def run(x: str, keep: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bootseer", "run", "--warm", "-e", f"X={x}",
                               "--", sys.executable, "train.py", "conf.yaml"], cwd=work,
                              env={**env, "BOOTSEER_WARM_KEEP_S": keep}, capture_output=True,
                              text=True, timeout=60)
    first = run("1", "20")
    assert first.returncode == 0 and "kept for 20 s idle" in first.stderr, first.stderr
    pid = int(first.stderr.split("warm: zygote ")[1].split()[0])
    assert __import__("json").loads(first.stdout)["parent"] == pid   # served warm
    second = run("2", "0")
    assert f"kept zygote {pid}" in second.stderr and "zygote stopped" in second.stderr
    assert __import__("json").loads(second.stdout)["parent"] == pid
    for _ in range(100):   # nothing left running, no socket left
        if not os.path.exists(f"/proc/{pid}") and not list(wdir.iterdir()):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}") and not list(wdir.iterdir())
    assert subprocess.run([sys.executable, "-m", "bootseer", "run", "--warm", "--", "bash", "-c",
                           "true"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=60).stderr.count("no Python script in the command") == 1


TORCH_SCRIPT = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
x = torch.randn(16, 8)
loss = model(x).pow(2).mean()
loss.backward()
t = torch.tensor([loss.item()])
dist.all_reduce(t)
# one write per line: two workers share the pipe, and print() writes the end of line apart
os.write(1, f"rank {dist.get_rank()} loss {loss.item():.6f} sum {t.item():.6f} "
            f"ppid {os.getppid()}\\n".encode())
dist.barrier()
dist.destroy_process_group()
"""


def _ready(z: subprocess.Popen) -> bool:
    assert z.stderr is not None
    for line in z.stderr:   # "not imported" lines may come first
        if "zygote ready" in line:
            return True
    return False


@pytest.mark.torch
def test_torchrun_workers_served_warm_give_the_cold_loss(job):
    pytest.importorskip("torch")
    work, env, _zygote, _worker = job
    (work / "train.py").write_text(TORCH_SCRIPT)
    env.update(OMP_NUM_THREADS="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", "29731"]

    def lines(argv: list[str], **extra: str) -> tuple[list[str], str]:
        p = subprocess.run(argv, cwd=work, env={**env, **extra}, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return sorted(ln for ln in p.stdout.splitlines() if ln.startswith("rank")), p.stderr
    # the cold start, captured: it records the modules imported before its first collective
    modules = work / "modules"
    from bootseer.trace import auto
    cold, _ = lines([*torchrun, "train.py"], BOOTSEER_TRACE_AUTO="1",
                    BOOTSEER_TRACE_LOCATION=str(work / "trace"), BOOTSEER_WARM_MODULES=str(modules),
                    PYTHONPATH=f"{auto.site_dir()}:{env['PYTHONPATH']}")
    recorded = modules.read_text().split()
    assert "torch" in recorded and "__main__" not in recorded
    z = subprocess.Popen([sys.executable, "-m", "bootseer.warm.zygote", "--modules",
                          ",".join(recorded), "--idle", "30", "--", "train.py"], cwd=work,
                         env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert _ready(z)
        from bootseer.warm.session import route
        routed = route([*torchrun, "train.py"], env)
        assert not isinstance(routed, str) and "--launch" in routed.argv
        warm, err = lines(routed.argv)
        assert "cold start" not in err, err   # neither torchrun itself nor a worker
        assert [ln.rsplit(" ppid", 1)[0] for ln in warm] == \
            [ln.rsplit(" ppid", 1)[0] for ln in cold]
        assert all(ln.endswith(f"ppid {z.pid}") for ln in warm)
    finally:
        z.terminate()
        z.wait(10)


def test_route_rewrites_python_and_torchrun_and_says_why_not():
    from bootseer.warm.session import Routed, route
    r = route(["torchrun", "--nproc-per-node", "2", "train.py", "--cfg", "c.yaml"],
              {"PATH": os.path.dirname(sys.executable)})
    assert isinstance(r, Routed) and r.worker == ["train.py", "--cfg", "c.yaml"]
    # torchrun itself is served by the zygote too; its workers by the launcher
    py = r.python
    assert r.argv[:8] == [py, "-m", "bootseer.warm.worker", "--launch", "torch.distributed.run",
                          "--", "--nproc-per-node", "2"]
    assert r.argv[8:15] == ["--no-python", py, "-u", "-m", "bootseer.warm.worker", "--",
                            "train.py"]
    from bootseer.warm.worker import launched_worker
    assert launched_worker(r.argv[6:]) == r.worker
    r = route(["python3", "train.py", "a"], {})
    assert isinstance(r, Routed) and r.argv == ["python3", "-m", "bootseer.warm.worker", "--",
                                                "train.py", "a"]
    assert "no Python script" in str(route(["bash", "-c", "true"], {}))
    assert "neither python nor torchrun" in str(route(["env", "train.py"], {}))
    assert "module" in str(route(["torchrun", "--no-python", "x.py"], {}))
    # the demo's form: torchrun by -m, options with values before the script
    r = route(["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--monitor-interval",
               "0.5", "train.py", "a"], {})
    assert not isinstance(r, str) and r.worker == ["train.py", "a"], r
    assert r.argv[:9] == ["python3", "-m", "bootseer.warm.worker", "--launch",
                          "torch.distributed.run", "--", "--nnodes", "2", "--monitor-interval"]
    assert "module" in str(route(["torchrun", "--nnodes", "1", "-m", "pkg", "x.py"], {}))


def test_an_environment_restored_again_at_the_same_prefix_is_another_key(tmp_path):
    """The prefix's completion marker (the snapshot's key) is part of the key: the same
    path holding other packages must not be served by a zygote that imported the old ones."""
    from bootseer.warm.key import ENV_MARKER, key_difference, warm_key
    prefix = tmp_path / "env"
    prefix.mkdir()
    (tmp_path / "train.py").write_text("print(1)\n")
    env = {"BOOTSEER_ENV_PREFIX": str(prefix)}
    (prefix / ENV_MARKER).write_text('{"key": "sha256:aaa"}')
    before = warm_key(["train.py"], env, str(tmp_path))
    assert key_difference(before, warm_key(["train.py"], env, str(tmp_path))) is None
    (prefix / ENV_MARKER).write_text('{"key": "sha256:bbb"}')
    assert key_difference(before, warm_key(["train.py"], env, str(tmp_path))) == \
        "key differs: installed.BOOTSEER_ENV_PREFIX"


def test_the_supervisor_serves_the_launcher_itself_only_with_its_own_interpreter(tmp_path):
    """Asking the zygote from the supervisor saves an interpreter start; another python,
    or one with flags of its own, is run as its own process."""
    from bootseer.warm.supervisor import _launcher_args
    here = os.path.dirname(sys.executable)
    env = {"PATH": here}
    name = os.path.basename(sys.executable)
    run = [name, "-m", "bootseer.warm.worker", "--launch", "torch.distributed.run", "--",
           "--nnodes", "2", "--no-python", name, "-u", "-m", "bootseer.warm.worker", "--",
           "train.py"]
    assert _launcher_args(run, env) == run[3:]
    assert _launcher_args([name, "-X", "dev", *run[1:]], env) is None
    other = tmp_path / "python3"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    assert _launcher_args(["python3", *run[1:]], {"PATH": str(tmp_path)}) is None
    assert _launcher_args([name, "train.py"], env) is None


def test_an_idle_zygote_is_the_first_to_go_under_memory_pressure(job, tmp_path):
    """It asks the OOM killer to pick it first (its children get the worker's setting
    back) and ends itself while idle when the node's available memory runs low."""
    work, env, zygote, worker = job
    z = zygote()
    assert int(open(f"/proc/{z.pid}/oom_score_adj").read()) == 1000
    p = worker({"SLEEP": "30"})
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    child = _served_child(p.pid)
    assert open(f"/proc/{child}/oom_score_adj").read() == open("/proc/self/oom_score_adj").read()
    p.kill()
    p.wait(10)
    # a node with less available than asked for: the idle zygote drops itself
    low = subprocess.Popen([sys.executable, "-m", "bootseer.warm.zygote", "--low-memory-mb",
                            str(1 << 40), "--", "other.py"], cwd=work, env=env,
                           stderr=subprocess.PIPE, text=True)
    assert low.wait(20) == 0
    err = low.stderr.read() if low.stderr else ""
    assert "zygote: dropped (memory pressure:" in err, err
    from bootseer.warm.key import socket_path
    assert not os.path.exists(socket_path(["other.py"], str(work), env))   # removed as it went
    assert z.poll() is None   # the default floor (5 % of memory): this node is not short


def test_a_forked_child_traces_as_a_cold_worker_would(job, tmp_path):
    """A zygote started without the job's trace settings (kept between containers): the
    child installs the capture the worker's environment turns on, so its rank's phases
    reach the trace."""
    work, env, _zygote, worker = job
    from bootseer.trace import auto
    (work / "later.py").write_text("import colorsys\nprint('ok', flush=True)\n")
    env["PYTHONPATH"] = f"{auto.site_dir()}:{env['PYTHONPATH']}"   # as bootseer run sets it
    z = subprocess.Popen([sys.executable, "-m", "bootseer.warm.zygote", "--modules", "json",
                          "--idle", "30", "--", "later.py"], cwd=work, env=env,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert _ready(z)
        traced = tmp_path / "trace"
        p = subprocess.run([sys.executable, "-m", "bootseer.warm.worker", "--", "later.py"],
                           cwd=work, capture_output=True, text=True, timeout=20,
                           env={**env, "RANK": "3", "BOOTSEER_TRACE_AUTO": "1",
                                "BOOTSEER_TRACE_LOCATION": str(traced)})
        assert p.returncode == 0 and p.stdout == "ok\n" and "cold start" not in p.stderr
        events = [__import__("json").loads(line) for f in traced.rglob("*.jsonl")
                  for line in f.read_text().splitlines() if line.strip()]
        served = next(e["attrs"]["pid"] for e in events if e["phase"] == "job.warm")
        child = [e for e in events if e["pid"] == served]   # the fork's own events
        assert [(e["phase"], e["rank"]) for e in child] == [("python.start", 3)], events
    finally:
        z.terminate()
        z.wait(10)
