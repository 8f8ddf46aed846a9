"""The job's own trace with no change to its image: the capture shim in a real container
whose image has Python but no bootseer; `bootseer run` on the host around a 2-process
torchrun job; attempts counted per start; bootseer.ready()."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.config import TraceConfig
from bootseer.report import load
from bootseer.report.views import attempts
from bootseer.run import container as C
from bootseer.run import tracing
from tests.conftest import BUSYBOX, is_root, make_busybox_rootfs, need

TRAIN = Path(__file__).parents[1] / "trace" / "torch_train.py"
# The image's own sitecustomize: the shim must run it, as if the shim were not there.
IMAGE_SITECUSTOMIZE = ("import os\nif os.path.isdir('/out'):\n"
                       "    open('/out/chained', 'w').write('image sitecustomize ran')\n")


def make_python_rootfs(root: Path) -> Path:
    """busybox + this machine's system python3 (binary, its shared libraries, the standard
    library hard-linked): an image with Python and without bootseer."""
    make_busybox_rootfs(root)
    python = os.path.realpath("/usr/bin/python3")
    version = Path(python).name                       # python3.11
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(python, root / "usr/bin" / version)
    os.symlink(version, root / "usr/bin/python3")
    out = subprocess.run(["ldd", python], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        path = line.split("=>")[-1].split("(")[0].strip()
        if path.startswith("/"):
            (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(path), root / path.lstrip("/"))
    stdlib = root / "usr/lib" / version
    if subprocess.run(["cp", "-al", f"/usr/lib/{version}", str(stdlib)]).returncode != 0:
        shutil.copytree(f"/usr/lib/{version}", stdlib, symlinks=True, dirs_exist_ok=True)
    site = stdlib / "sitecustomize.py"
    if site.is_symlink() or site.exists():
        site.unlink()
    site.write_text(IMAGE_SITECUSTOMIZE)
    return root


@pytest.fixture(scope="module")
def python_rootfs(tmp_path_factory):
    need(os.path.exists(BUSYBOX) and os.path.exists("/usr/bin/python3"),
         "busybox-static and a system python3 are needed")
    root = make_python_rootfs(tmp_path_factory.mktemp("pyroot"))
    check = subprocess.run(["chroot", str(root), "python3", "-c", "import bootseer"],
                           capture_output=True, text=True) if is_root() else None
    assert check is None or "No module named 'bootseer'" in check.stderr
    return root


JOB = """\
import os, sys
try:
    import bootseer
    sys.exit("bootseer is in the image")
except ImportError:
    pass
import json, email.parser, http.client   # some imports to time
from bootseer_shim import ready
ready()
try:
    open("/run/bootseer/shim/x", "w")
    sys.exit("the shim is writable")
except OSError:
    pass
print(os.environ["BOOTSEER_TRACE_NODE"], os.environ["BOOTSEER_TRACE_ATTEMPT"],
      os.environ.get("SLURM_PROCID"), file=open("/out/env", "w"))
"""


@pytest.mark.parametrize("runtime", ["podman", "chroot"])
def test_capture_in_an_image_without_bootseer(runtime, python_rootfs, tmp_path, monkeypatch):
    need(is_root(), "containers need root")
    need(runtime in C.available_runtimes(), f"{runtime} is not installed")
    monkeypatch.setenv("BOOTSEER_TRACE_START", "5eed")
    monkeypatch.setenv("SLURM_PROCID", "3")            # the scheduler's variables pass
    trace = TraceConfig(location=str(tmp_path / "trace"), job_id="img", attempt=2, node="n1")
    env, binds = tracing.job_setup(trace, tmp_path / "state", in_container=True, image_env={})
    job, out = tmp_path / "job", tmp_path / "out"
    job.mkdir()
    out.mkdir()
    (job / "job.py").write_text(JOB)
    c = C.Container(rootfs=str(python_rootfs), argv=["python3", "/job/job.py"],
                    env={**env, "BOOTSEER_READY_FILE": "/out/ready"},
                    binds=[*binds, C.Bind(str(job), "/job"),
                           C.Bind(str(out), "/out", readonly=False)])
    assert C.run(c, runtime=runtime) == 0
    assert (out / "ready").exists()
    assert (out / "chained").read_text() == "image sitecustomize ran"
    assert (out / "env").read_text().split() == ["n1", "2", "3"]
    (f,) = (tmp_path / "trace" / "img" / "2").glob("*.jsonl")
    assert f.name.startswith("n1-5eed-")               # unique per start
    events = [json.loads(line) for line in f.read_text().splitlines()]
    phases = {e["phase"] for e in events}
    assert {"python.start", "ready"} <= phases
    assert {(e["job"], e["attempt"], e["node"], e["start_id"]) for e in events} == \
        {("img", 2, "n1", "5eed")}


def test_shim_is_standard_library_only(tmp_path):
    """The shim imports in an isolated interpreter that cannot see bootseer."""
    shim = tracing.write_shim(tmp_path / "shim")
    probe = ("import sys; import bootseer_shim.auto as a, bootseer_shim.record as r; "
             "assert 'bootseer' not in sys.modules, sorted(m for m in sys.modules "
             "if m.startswith('bootseer')); print(a.record is r)")
    r = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {shim!r});"
                        + probe], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def bootseer_run(*args: str, env=None, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bootseer", "run", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if not k.startswith("BOOTSEER_TRACE_") and not k.endswith("RESTART_COUNT")}


@pytest.mark.timeout(300)
def test_torchrun_through_bootseer_run_is_captured_with_no_flag(tmp_path):
    """A 2-process gloo job started by `bootseer run` on the host: each rank's phases
    (imports, init, first collective, checkpoint load, first step) with no change to it,
    also when the job is given a PYTHONPATH of its own (-e: the capture stays on it)."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "extra").mkdir()
    env = {**_clean_env(), "PYTHONPATH": ""}
    r = subprocess.run([sys.executable, "-m", "bootseer", "run", "--store", str(tmp_path / "s"),
                        "--trace", str(tmp_path / "trace"), "--job-id", "gloo",
                        "--node", "n0", "--summary", str(tmp_path / "summary.json"),
                        "-e", f"PYTHONPATH={tmp_path / 'extra'}", "--",
                        sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", str(TRAIN), str(tmp_path / "ckpt")],
                       capture_output=True, text=True, timeout=280,
                       env={**env, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    t = load.load(tmp_path / "trace" / "gloo")
    ranks = {e["rank"] for e in t.events if e["rank"] is not None}
    assert ranks == {0, 1}
    for rank in (0, 1):
        mine = {e["phase"] for e in t.events if e["rank"] == rank}
        assert {"import.torch", "dist.init", "dist.first_collective", "rendezvous", "ckpt.load",
                "train.first_step", "ready"} <= mine, mine
    assert {e["attempt"] for e in t.events} == {0}
    marks = [e["start"] for e in t.events if e["phase"] == "rendezvous"]
    assert len(marks) == 2 and abs(marks[0] - marks[1]) < 1.0   # both ranks left together
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ready_s"] is not None        # the first step created the ready file


@pytest.mark.timeout(120)
def test_starts_without_attempt_are_attempts_0_and_1(tmp_path):
    args = ["--store", str(tmp_path / "s"), "--trace", str(tmp_path / "trace"), "--job-id", "j",
            "--node", "n0", "--", sys.executable, "-c", "import bootseer; bootseer.ready()"]
    for _ in range(2):
        r = bootseer_run(*args, env=_clean_env())
        assert r.returncode == 0, r.stderr
    t = load.load(tmp_path / "trace" / "j")
    assert sorted({e["attempt"] for e in t.events}) == [0, 1]
    readies = [e for e in t.events if e["phase"] == "ready"]
    assert {e["attempt"] for e in readies} == {0, 1}
    files = sorted(p.name for p in (tmp_path / "trace" / "j").rglob("*.jsonl"))
    assert len({name.split("-")[1] for name in files}) == 2    # two start ids
    assert [v.attempt for v in attempts(t.events)] == [0, 1]
    rep = subprocess.run([sys.executable, "-m", "bootseer", "report",
                          str(tmp_path / "trace" / "j")], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    assert "attempt 0" in rep.stdout and "attempt 1" in rep.stdout, rep.stdout
    # the scheduler's restart count wins over the store's counter
    r = bootseer_run(*args, env={**_clean_env(), "SLURM_RESTART_COUNT": "7"})
    assert r.returncode == 0, r.stderr
    assert 7 in {e["attempt"] for e in load.load(tmp_path / "trace" / "j").events}


@pytest.mark.timeout(60)
def test_ready_call_creates_the_ready_file_and_marks(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOTSEER_TRACE_LOCATION", str(tmp_path / "trace"))
    monkeypatch.setenv("BOOTSEER_READY_FILE", str(tmp_path / "ready"))
    r = subprocess.run([sys.executable, "-c",
                        "import bootseer; bootseer.ready(); bootseer.ready()"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ready").exists()
    events = load.load(tmp_path / "trace").events
    assert [e["phase"] for e in events if e["phase"] == "ready"] == ["ready"]   # once


def test_bad_container_settings_fail_before_anything_is_mounted(tmp_path):
    """A network podman refuses, or GPUs asked on a node without them: one line, exit 1,
    before the image is even looked up."""
    need("podman" in C.available_runtimes(), "podman is not installed")
    for runtime, why in (("podman", "podman has no such network or mode"),
                         ("chroot", "the chroot runtime supports host, none and ns:PATH")):
        r = bootseer_run("--image", "127.0.0.1:1/none:latest", "--store", str(tmp_path / "s"),
                         "--network", "no-such-net", "--runtime", runtime, "--", "true")
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"error: --network no-such-net: {why}" in r.stderr
    if Path("/dev/nvidiactl").exists():
        return
    r = bootseer_run("--image", "127.0.0.1:1/none:latest", "--store", str(tmp_path / "s"),
                     "--gpus", "all", "--", "true")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no GPU can be passed on this node" in r.stderr and "docs/gpu.md" in r.stderr
    r = bootseer_run("--gpus", "many", "--", "true")
    assert r.returncode != 0 and "expected all, none, auto" in r.stderr
