"""Warm starts inside an image without bootseer: the shipped package, the supervisor as the
container's command, the zygote in the job's own rootfs and mount namespace."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.run import container as C
from bootseer.warm import ship
from bootseer.warm.key import socket_path
from tests.conftest import BUSYBOX, is_root, need
from tests.run.test_job_trace import make_python_rootfs

JOB = """\
import os, sys, json
sys.stdout.write(f"rank {os.environ.get('RANK')} argv {sys.argv[1:]} file {__file__}\\n")
sys.stdout.flush()
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory):
    need(is_root(), "containers need root")
    need(os.path.exists(BUSYBOX) and os.path.exists("/usr/bin/python3"),
         "busybox-static and a system python3 are needed")
    need("chroot" in C.available_runtimes(), "the chroot runtime is needed")
    return make_python_rootfs(tmp_path_factory.mktemp("warmroot"))


def _run(rootfs: Path, tmp: Path, argv: list[str], warm: bool, out: str = ""):
    job, out_dir = tmp / "job", tmp / f"out-{warm}{out}"
    job.mkdir(exist_ok=True)
    out_dir.mkdir()
    (job / "train.py").write_text(JOB)
    env, binds = {"RANK": "0", "PYTHONUNBUFFERED": "1"}, [C.Bind(str(job), "/job")]
    if warm:
        pkg = ship.write_package(tmp / "pkg")
        binds += [C.Bind(pkg, ship.CONTAINER_PKG_DIR),
                  C.Bind(ship.host_dir(str(tmp / "warm"), "img"), ship.CONTAINER_DIR,
                         readonly=False)]
        env |= {"PYTHONPATH": ship.CONTAINER_PKG_DIR, "BOOTSEER_WARM_DIR": ship.CONTAINER_DIR}
        argv = ship.container_command(argv, max_rss_mb=0, timeout_s=5)
    c = C.Container(rootfs=str(rootfs), argv=argv, workdir="/job", env=env, binds=binds)
    stdout, stderr = out_dir / "stdout", out_dir / "stderr"
    with open(stdout, "wb") as o, open(stderr, "wb") as e:
        running = C.start(c, runtime="chroot", stdout=o, stderr=e)
        try:
            rc = running.wait()
        finally:
            running.kill()
    return rc, stdout.read_text(), stderr.read_text()


def test_worker_served_warm_in_an_image_matches_cold(rootfs, tmp_path):
    cold = _run(rootfs, tmp_path, ["python3", "train.py", "3", "--x=1"], warm=False)
    warm = _run(rootfs, tmp_path, ["python3", "train.py", "3", "--x=1"], warm=True)
    assert cold[0] == warm[0] == 3, (cold, warm)
    assert warm[1] == cold[1] and "rank 0 argv ['3', '--x=1'] file /job/train.py" in cold[1]
    assert "zygote" in warm[2] and "started" in warm[2], warm[2]
    assert "cold start" not in warm[2] and "zygote stopped" in warm[2], warm[2]
    assert not list((tmp_path / "warm").glob("image-*/*.sock")), "the zygote ended with the job"
    # the next start of the image imports the list this one's capture wrote (bound dir)
    host = ship.host_dir(str(tmp_path / "warm"), "img")
    slot = socket_path(["train.py"], "/job", {"BOOTSEER_WARM_DIR": host})
    Path(slot[:-len(".sock")] + ".modules").write_text("json\nemail\n")
    again = _run(rootfs, tmp_path, ["python3", "train.py", "3", "--x=1"], warm=True, out="again")
    assert again[:2] == cold[:2] and "2 modules imported" in again[2], again[2]


def test_shipped_package_is_standard_library_only(tmp_path):
    pkg = ship.write_package(tmp_path / "pkg")
    probe = ("import sys; import bootseer_warm.supervisor, bootseer_warm.worker, "
             "bootseer_warm.zygote; assert not [m for m in sys.modules if m.startswith("
             "'bootseer.') or m == 'bootseer'], sorted(sys.modules); "
             "print(bootseer_warm.session._PKG)")
    r = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {pkg!r});"
                        + probe], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "bootseer_warm", r.stderr


@pytest.fixture
def python_image(registry, rootfs, tmp_path):
    from tests.run.test_baseline import push_busybox
    return push_busybox(registry, rootfs, tmp_path, tag="py")


def _bootseer(*args, env):
    return subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=200)


@pytest.mark.timeout(240)
def test_lazy_image_run_warm_matches_cold(need_fuse, python_image, tmp_path):
    """``bootseer run --image --warm`` on a lazy image: the worker is forked from a zygote
    inside the container and ends as the cold one did."""
    store, job = str(tmp_path / "store"), tmp_path / "job"
    assert _bootseer("image", "convert", python_image, "--to", store, env={}).returncode == 0
    job.mkdir()
    (job / "train.py").write_text(JOB)
    env = {"BOOTSEER_STORE_URL": store, "BOOTSEER_CACHE_DIR": str(tmp_path / "c"),
           "BOOTSEER_WARM_DIR": str(tmp_path / "warm")}
    runs = {}
    for warm in ([], ["--warm"]):
        runs[bool(warm)] = _bootseer("run", "--image", python_image, *warm, "--runtime",
                                     "chroot", "--bind", f"{job}:/job", "--workdir", "/job",
                                     "--", "python3", "train.py", "5", env=env)
    cold, warm_run = runs[False], runs[True]
    assert cold.returncode == warm_run.returncode == 5, (cold.stderr, warm_run.stderr)
    assert cold.stdout == warm_run.stdout and "file /job/train.py" in cold.stdout
    assert "started" in warm_run.stderr and "cold start" not in warm_run.stderr, warm_run.stderr
    assert "zygote" not in cold.stderr
    # a warm.dir that is not a 0700 directory of this user: one line, and the job runs cold
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    bad = _bootseer("run", "--image", python_image, "--warm", "--runtime", "chroot", "--bind",
                    f"{job}:/job", "--workdir", "/job", "--", "python3", "train.py", "5",
                    env={**env, "BOOTSEER_WARM_DIR": str(loose)})
    assert bad.returncode == 5 and bad.stdout == cold.stdout, bad.stderr
    assert "is not a 0700 directory" in bad.stderr and "workers start cold" in bad.stderr


SLEEPER = """\
import time
try:
    print("up", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    raise
"""


def _signalled(rootfs: Path, tmp: Path, sig: int, warm: bool) -> tuple[int, bytes]:
    job = tmp / "sleeper"
    job.mkdir(exist_ok=True)
    (job / "train.py").write_text(SLEEPER)
    env, binds, argv = {"PYTHONUNBUFFERED": "1"}, [C.Bind(str(job), "/job")], ["python3",
                                                                             "train.py"]
    if warm:
        binds += [C.Bind(ship.write_package(tmp / "pkg"), ship.CONTAINER_PKG_DIR),
                  C.Bind(ship.host_dir(str(tmp / "warm"), "img"), ship.CONTAINER_DIR,
                         readonly=False)]
        env |= {"PYTHONPATH": ship.CONTAINER_PKG_DIR, "BOOTSEER_WARM_DIR": ship.CONTAINER_DIR}
        argv = ship.container_command(argv, max_rss_mb=0, timeout_s=5)
    c = C.Container(rootfs=str(rootfs), argv=argv, workdir="/job", env=env, binds=binds)
    running = C.start(c, runtime="chroot", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert running.proc.stdout.readline() == b"up\n"
        running.send_signal(sig)
        return running.wait(), running.proc.stdout.read()
    finally:
        running.kill()


def test_ctrl_c_and_sigterm_in_an_image(rootfs, tmp_path):
    """Ctrl-C reads as cold (KeyboardInterrupt in the job, 130); SIGTERM ends the warm job
    with 143, as outside a container (a cold job that is the container's PID 1 ignores it)."""
    import signal
    cold = _signalled(rootfs, tmp_path, signal.SIGINT, warm=False)
    assert _signalled(rootfs, tmp_path, signal.SIGINT, warm=True) == cold == (130,
                                                                              b"interrupted\n")
    assert _signalled(rootfs, tmp_path, signal.SIGTERM, warm=True) == (143, b"")


CAPTURED_JOB = """\
import json, sys
import torch.distributed as dist
dist.barrier()   # the first collective: the capture writes the modules imported so far
print("done", file=sys.stderr)
"""


def test_the_capture_in_an_image_records_the_modules_for_the_next_zygote(rootfs, tmp_path):
    """The in-image capture (the trace shim) of a warm start writes the module list into
    the bound per-image directory, and the next start's zygote imports it. (A stand-in
    ``torch.distributed`` in the job's directory: the image has no torch.)"""
    from bootseer.config import TraceConfig
    from bootseer.run import tracing
    job = tmp_path / "job"
    (job / "torch/distributed").mkdir(parents=True)
    (job / "torch/__init__.py").write_text("")
    (job / "torch/distributed/__init__.py").write_text("def barrier():\n    return None\n")
    (job / "train.py").write_text(CAPTURED_JOB)
    warm_root = str(tmp_path / "warm")
    said = []
    for n in range(2):
        state = tmp_path / f"state{n}"
        env, binds = tracing.job_setup(TraceConfig(location=str(tmp_path / "trace"),
                                                   attempt=n), state, in_container=True)
        env = {**env, "PYTHONUNBUFFERED": "1"}
        settings = type("W", (), {"dir": warm_root, "max_rss_mb": 0, "timeout_s": 5.0})()
        argv, more = ship.in_container(state / "warmpkg", settings, "img",
                                       ["python3", "train.py"], env)
        binds = [*binds, C.Bind(str(job), "/job"),
                 *(C.Bind(src, dst, readonly=ro) for src, dst, ro in more)]
        c = C.Container(rootfs=str(rootfs), argv=argv, workdir="/job", env=env, binds=binds)
        err = tmp_path / f"stderr{n}"
        with open(err, "wb") as e:
            running = C.start(c, runtime="chroot", stdout=subprocess.DEVNULL, stderr=e)
            try:
                assert running.wait() == 0, err.read_text()
            finally:
                running.kill()
        said.append(err.read_text())
    host = ship.host_dir(warm_root, "img")
    written = Path(socket_path(["train.py"], "/job", {"BOOTSEER_WARM_DIR": host})[:-5]
                   + ".modules").read_text().split()
    assert "json" in written and "torch" in written, written
    assert "0 modules imported" in said[0] and f"{len(written)} modules imported" in said[1], \
        said
    assert "cold start" not in said[1], said[1]
