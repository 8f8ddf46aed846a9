"""A zygote kept between containers (``warm.keep_s``): started as a detached container of
its own by the first image start, reused by the next, replaced when stale or dead, gone
after ``keep_s`` idle seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bootseer.config.settings import WarmConfig
from bootseer.run import container as C
from bootseer.run import warmkeep
from bootseer.warm import ship
from tests.conftest import BUSYBOX, is_root, need
from tests.run.test_job_trace import make_python_rootfs

JOB = """\
import os, sys
print(f"rank {os.environ.get('RANK')} sees {open('/data/x').read()}", flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory):
    need(is_root(), "containers need root")
    need(os.path.exists(BUSYBOX) and os.path.exists("/usr/bin/python3"),
         "busybox-static and a system python3 are needed")
    need("chroot" in C.available_runtimes(), "the chroot runtime is needed")
    return make_python_rootfs(tmp_path_factory.mktemp("keptroot"))


def _start(rootfs: Path, tmp: Path, settings: WarmConfig, rank: str, env_extra=None,
           argv=("python3", "train.py", "7"), runtime="chroot"):
    job, state = tmp / "job", tmp / f"state-{time.monotonic_ns()}"
    (state / "data").mkdir(parents=True)
    (state / "data/x").write_text(f"this run's {rank}")   # a per-run mount the zygote lacks
    env = {"RANK": rank, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    binds = [C.Bind(str(job), "/job"), C.Bind(str(state / "data"), "/data")]
    kept = warmkeep.prepare(settings, rootfs=str(rootfs), image="tree-1",
                            argv=list(argv), env=env, workdir="/job",
                            binds=binds, options=C.Options(), per_run=str(state),
                            runtime=runtime)
    assert kept is not None
    c = C.Container(rootfs=str(rootfs), argv=kept.argv, workdir="/job", env=env,
                    binds=binds + kept.binds)   # the forked child sees the job's mounts
    r = C.start(c, runtime=runtime, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = r.proc.communicate(timeout=60)
        rc = r.wait()
    finally:
        r.kill()
    return kept, rc, out.decode(), err.decode(), kept.close()


def _record(settings: WarmConfig) -> dict:
    return json.loads(Path(ship.host_dir(settings.dir, "tree-1"), warmkeep.RECORD).read_text())


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not warmkeep._alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(120)
def test_kept_zygote_serves_the_next_start_and_goes_after_keep_s(rootfs, tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job/train.py").write_text(JOB)
    settings = WarmConfig(keep_s=6.0, dir=str(tmp_path / "warm"), timeout_s=5.0)
    first = _start(rootfs, tmp_path, settings, "0")
    assert not first[0].hit and "no kept zygote" in first[0].said, first[0].said
    assert first[1] == 7 and "rank 0 sees this run's 0" in first[2], first
    assert first[4].startswith("warm: zygote kept for 6 s idle ("), first[4]
    pid = _record(settings)["pid"]
    assert warmkeep._alive(pid), "kept after the job"
    second = _start(rootfs, tmp_path, settings, "3")
    assert second[0].hit and second[0].said == f"warm: kept zygote {pid} reused", second[0]
    assert second[1] == 7 and second[2] == "rank 3 sees this run's 3\n", second
    assert "cold start" not in second[3] and "warm: zygote kept (" in second[3], second[3]
    # an environment that differs: a miss, the stale one stopped by its PID
    third = _start(rootfs, tmp_path, settings, "1", {"OMP_NUM_THREADS": "2"})
    assert not third[0].hit and "key differs: env.OMP_NUM_THREADS" in third[0].said
    assert third[1] == 7 and "rank 1" in third[2] and not warmkeep._alive(pid)
    # changed code: the zygote itself says it is stale
    pid = _record(settings)["pid"]
    (tmp_path / "job/train.py").write_text(JOB + "# changed\n")
    fourth = _start(rootfs, tmp_path, settings, "2", {"OMP_NUM_THREADS": "2"})
    assert "key differs: file.train.py" in fourth[0].said and not warmkeep._alive(pid)
    assert fourth[1] == 7 and "rank 2" in fourth[2], fourth
    # the job's capture wrote a module list: at the job's end a zygote importing it is
    # started for the next start, which it serves
    pid, host = _record(settings)["pid"], Path(ship.host_dir(settings.dir, "tree-1"))
    (host / _record(settings)["socket"].replace(".sock", ".modules")).write_text("json\nemail\n")
    closed = fourth[0].close()
    # (the run's own root is removed as it ends: that zygote imports before close returns)
    assert "new module list: zygote" in closed and "2 modules imported" in closed, closed
    assert not warmkeep._alive(pid)
    fifth = _start(rootfs, tmp_path, settings, "2", {"OMP_NUM_THREADS": "2"})
    assert fifth[0].hit and fifth[2] == "rank 2 sees this run's 2\n", fifth
    # after keep_s idle seconds nothing is left running: the zygote and its namespace
    pid = _record(settings)["pid"]
    assert _gone(pid, settings.keep_s + 10), "the kept zygote outlived keep_s"


@pytest.mark.timeout(180)
def test_a_podman_job_is_served_by_the_kept_zygote(rootfs, tmp_path):
    """The zygote's container is the chroot runtime's whatever the job's: a podman job's
    workers reach it through the bound socket directory and its forks chroot into the
    podman container's root (its mounts: this run's /data)."""
    need("podman" in C.available_runtimes(), "podman is needed")
    (tmp_path / "job").mkdir()
    (tmp_path / "job/train.py").write_text(JOB)
    settings = WarmConfig(keep_s=30.0, dir=str(tmp_path / "warm"), timeout_s=5.0)
    first = _start(rootfs, tmp_path, settings, "0", runtime="podman")
    assert first[1] == 7 and "rank 0 sees this run's 0" in first[2], first
    assert first[4].startswith("warm: zygote kept for 30 s idle ("), first[4]
    pid = _record(settings)["pid"]
    second = _start(rootfs, tmp_path, settings, "4", runtime="podman")
    assert second[0].hit and second[0].said == f"warm: kept zygote {pid} reused", second[0]
    assert second[1] == 7 and second[2] == "rank 4 sees this run's 4\n", second
    assert "cold start" not in second[3], second[3]
    warmkeep.stop(_record(settings))
    assert _gone(pid, 10)


# torchrun with --no-python, as far as a launcher matters here: run the worker, end as it
FAKE_TORCHRUN = """\
import subprocess, sys
args = sys.argv[1:]
sys.exit(subprocess.call(args[args.index("--no-python") + 1:]))
"""


@pytest.mark.timeout(120)
def test_a_kept_zygote_serves_torchrun_itself_and_its_workers(rootfs, tmp_path):
    """torchrun forked from a zygote in a container of its own lives in that container's
    PID namespace but the job's root (its /proc is the job's): its workers still reach the
    zygote and are signalled over the socket."""
    job = tmp_path / "job"
    (job / "torch/distributed").mkdir(parents=True)
    for pkg in ("torch", "torch/distributed"):
        (job / pkg / "__init__.py").write_text("")
    (job / "torch/distributed/run.py").write_text(FAKE_TORCHRUN)
    (job / "train.py").write_text(JOB)
    settings = WarmConfig(keep_s=15.0, dir=str(tmp_path / "warm"), timeout_s=5.0)
    argv = ("python3", "-m", "torch.distributed.run", "train.py", "7")
    first = _start(rootfs, tmp_path, settings, "0", argv=argv)
    assert first[1] == 7 and "rank 0 sees this run's 0" in first[2], first
    pid = _record(settings)["pid"]
    second = _start(rootfs, tmp_path, settings, "3", argv=argv)
    assert second[0].hit and second[0].said == f"warm: kept zygote {pid} reused", second[0]
    assert second[1] == 7 and second[2] == "rank 3 sees this run's 3\n", second
    assert "cold start" not in second[3] and "Traceback" not in second[3], second[3]
    warmkeep.stop(_record(settings))


@pytest.mark.timeout(120)
def test_killed_kept_zygote_falls_back(rootfs, tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job/train.py").write_text(JOB)
    settings = WarmConfig(keep_s=30.0, dir=str(tmp_path / "warm"), timeout_s=5.0)
    _start(rootfs, tmp_path, settings, "0")
    rec = _record(settings)
    os.kill(rec["pid"], signal.SIGKILL)
    assert _gone(rec["pid"], 10)
    again = _start(rootfs, tmp_path, settings, "5")
    assert not again[0].hit and f"kept zygote {rec['pid']} is gone" in again[0].said
    assert again[1] == 7 and "rank 5" in again[2], again
    # killed between the check and the worker: the worker starts cold, in one line
    rec = _record(settings)
    (tmp_path / "job/x").write_text("a cold one")
    kept = warmkeep.prepare(settings, rootfs=str(rootfs), image="tree-1",
                            argv=["python3", "train.py", "7"],
                            env={"RANK": "6", "PYTHONUNBUFFERED": "1"}, workdir="/job",
                            binds=[C.Bind(str(tmp_path / "job"), "/job")],
                            options=C.Options(), per_run=str(tmp_path / "nothing"))
    assert kept is not None and kept.hit
    warmkeep.stop(rec)
    c = C.Container(rootfs=str(rootfs), argv=kept.argv, workdir="/job",
                    env={"RANK": "6", "PYTHONUNBUFFERED": "1", "PYTHONPATH": "/run/bootseer/"
                         "warmpkg", "BOOTSEER_WARM_DIR": "/run/bootseer/warm"},
                    binds=[C.Bind(str(tmp_path / "job"), "/job"),
                           C.Bind(str(tmp_path / "job"), "/data"), *kept.binds])
    r = C.start(c, runtime="chroot", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = r.proc.communicate(timeout=60)
        assert r.wait() == 7 and out == b"rank 6 sees a cold one\n", err
        assert err.count(b"bootseer warm: cold start (zygote unreachable") == 1, err
    finally:
        r.kill()


@pytest.fixture
def python_image(registry, rootfs, tmp_path):
    from tests.run.test_baseline import push_busybox
    return push_busybox(registry, rootfs, tmp_path, tag="kept")


@pytest.mark.timeout(240)
def test_bootseer_run_image_keeps_the_zygote(need_fuse, python_image, tmp_path):
    """Two ``bootseer run --image --pull --warm`` starts with ``warm.keep_s``: the second is
    served by the zygote the first started, and ends as the first did."""
    import sys
    store, job = str(tmp_path / "store"), tmp_path / "job"
    run = [sys.executable, "-m", "bootseer"]
    assert subprocess.run([*run, "image", "convert", python_image, "--to", store],
                          capture_output=True).returncode == 0
    job.mkdir()
    (job / "train.py").write_text(JOB)
    (job / "x").write_text("the job's bind")
    env = {**os.environ, "BOOTSEER_STORE_URL": store, "BOOTSEER_CACHE_DIR": str(tmp_path / "c"),
           "BOOTSEER_WARM_DIR": str(tmp_path / "warm"), "BOOTSEER_WARM_KEEP_S": "30",
           "BOOTSEER_TRACE_LOCATION": str(tmp_path / "trace"), "BOOTSEER_TRACE_JOB_ID": "kept"}
    said = []
    try:
        for rank in ("0", "4"):
            r = subprocess.run([*run, "run", "--image", python_image, "--pull", "--warm",
                                "--runtime",
                                "chroot", "--bind", f"{job}:/job", "--bind", f"{job}:/data",
                                "--env", f"RANK={rank}", "--workdir", "/job", "--", "python3",
                                "train.py", "7"], capture_output=True, text=True, env=env,
                               timeout=200)
            assert r.returncode == 7 and r.stdout == f"rank {rank} sees the job's bind\n", r
            said.append(r.stderr)
    finally:
        for record in (tmp_path / "warm").glob(f"*/{warmkeep.RECORD}"):
            warmkeep.stop(json.loads(record.read_text()))
    # traced: the first start's workers start cold and record the module list (a child of
    # a kept zygote runs no capture); the zygote is started at its end, importing it
    assert "no kept zygote" in said[0] and "no module list recorded yet" in said[0], said[0]
    assert "started in a container of its own" in said[0], said[0]
    assert "warm: kept zygote" in said[1] and "reused" in said[1], said[1]
    assert "cold start" not in said[1], said[1]
    # the trace says it too: the run's job.warm (scope kept), a miss then a hit
    events = [json.loads(line) for f in sorted((tmp_path / "trace").rglob("*"))
              if f.is_file() for line in f.read_text(errors="replace").splitlines()
              if '"job.warm"' in line]
    kept = [(e["attrs"].get("hit"), e["attrs"].get("why")) for e in events
            if e.get("attrs", {}).get("scope") == "kept"]
    assert sorted(kept, key=str) == sorted([(False, "no kept zygote"), (True, None)], key=str)


def _mounted_under(pid: int, path: Path) -> list[str]:
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            return [ln.split()[4] for ln in f if ln.split()[4].startswith(str(path))]
    except OSError:
        return []


@pytest.mark.timeout(240)
def test_lazy_image_served_by_the_run_is_held_for_the_kept_zygote(need_fuse, python_image,
                                                                    tmp_path):
    """A lazy image the run serves itself (FUSE): the kept zygote runs on a mount of its own,
    held by a process of its own; the second start is served by it. Once the zygote has
    ended (here stopped by its PID, as a stale one is; after ``keep_s`` idle seconds it
    ends itself the same way), the holder unmounts and ends: nothing is left."""
    import sys
    store, job, warm = str(tmp_path / "store"), tmp_path / "job", tmp_path / "warm"
    run = [sys.executable, "-m", "bootseer"]
    assert subprocess.run([*run, "image", "convert", python_image, "--to", store],
                          capture_output=True).returncode == 0
    job.mkdir()
    (job / "train.py").write_text(JOB)
    (job / "x").write_text("the job's bind")
    env = {**os.environ, "BOOTSEER_STORE_URL": store, "BOOTSEER_CACHE_DIR": str(tmp_path / "c"),
           "BOOTSEER_WARM_DIR": str(warm), "BOOTSEER_WARM_KEEP_S": "120"}
    said, records = [], []
    try:
        for rank in ("0", "4"):
            r = subprocess.run([*run, "run", "--image", python_image, "--warm", "--runtime",
                                "chroot", "--bind", f"{job}:/job", "--bind", f"{job}:/data",
                                "--env", f"RANK={rank}", "--workdir", "/job", "--", "python3",
                                "train.py", "7"], capture_output=True, text=True, env=env,
                               timeout=200)
            assert r.returncode == 7 and r.stdout == f"rank {rank} sees the job's bind\n", r
            said.append(r.stderr)
        records = [json.loads(p.read_text()) for p in warm.glob(f"*/{warmkeep.RECORD}")]
        if "erofs-local" in said[0]:
            pytest.skip("this kernel mounts the local blob itself: nothing to hold")
        assert "on its own mount of the image (holder" in said[0], said[0]
        assert "warm: kept zygote" in said[1] and "reused" in said[1], said[1]
        assert "cold start" not in said[1], said[1]
        [record] = records
        holder, pid = record["holder"], record["pid"]
        assert _mounted_under(holder, warm), "the holder holds no mount of the image"
        assert _alive(pid) and _alive(holder)
        warmkeep.stop(record)   # returns once the holder has unmounted and ended
        assert not _alive(pid) and not _alive(holder), "kept zygote or holder still running"
        assert not list(warm.glob("*/ct-*")), "its state and mount point were not removed"
    finally:
        for record in records:
            warmkeep.stop(record)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


SLEEPER = """\
import sys, time
print("up", flush=True)
time.sleep(float(sys.argv[1]))
sys.exit(3)
"""


@pytest.mark.timeout(120)
def test_stale_zygote_serving_a_running_job_finishes_it(rootfs, tmp_path):
    """A start with another key while the kept zygote still serves a job: the running
    job's worker ends as it would (its exit status comes back), the stale zygote then ends;
    the directory is this user's, 0700."""
    (tmp_path / "job").mkdir()
    (tmp_path / "job/train.py").write_text(SLEEPER)
    (tmp_path / "data").mkdir()
    settings = WarmConfig(keep_s=30.0, dir=str(tmp_path / "warm"), timeout_s=5.0)
    binds = [C.Bind(str(tmp_path / "job"), "/job")]

    def start(extra):
        env = {"PYTHONUNBUFFERED": "1", **extra}
        kept = warmkeep.prepare(settings, rootfs=str(rootfs), image="tree-1",
                                argv=["python3", "train.py", "2"], env=env, workdir="/job",
                                binds=binds, options=C.Options(), per_run=str(tmp_path / "x"))
        assert kept is not None
        c = C.Container(rootfs=str(rootfs), argv=kept.argv, workdir="/job", env=env,
                        binds=binds + kept.binds)
        return kept, C.start(c, runtime="chroot", stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    first, running = start({})
    try:
        assert running.proc.stdout.readline() == b"up\n"
        old = _record(settings)
        second, other = start({"OMP_NUM_THREADS": "1"})
        assert "key differs: env.OMP_NUM_THREADS" in second.said
        assert warmkeep._alive(old["pid"]), "a zygote serving a job is not killed"
        assert running.wait() == 3 and b"exit status lost" not in running.proc.stderr.read()
        assert other.wait() == 3
    finally:
        running.kill()
        other.kill()
    assert _gone(old["pid"], 10), "the stopped zygote ends after its workers"
    host = Path(tmp_path / "warm")
    st = os.stat(next(host.glob("image-*")))
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
    warmkeep.stop(_record(settings))


def test_kept_zygote_needs_root_and_the_chroot_or_podman_runtime(tmp_path, caplog):
    """Another runtime: one line with a hint, and the zygote lives in the job's container."""
    settings = WarmConfig(keep_s=30.0, dir=str(tmp_path / "warm"))
    with caplog.at_level("WARNING", logger="bootseer.run.warmkeep"):
        kept = warmkeep.prepare(settings, rootfs=str(tmp_path), image="tree-1",
                                argv=["python3", "train.py"], env={}, workdir="/job", binds=[],
                                options=C.Options(), per_run=str(tmp_path / "x"),
                                runtime="rootless")
    assert kept is None and not (tmp_path / "warm").exists()
    assert [r.getMessage() for r in caplog.records] == [
        "warm: a zygote is kept between containers by root with --runtime chroot or podman "
        "only (this run: rootless); it lives in the job's container (hint: warm.keep_s = 0)"]


INTERRUPTED = """\
import time
try:
    print("up", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    raise
"""


@pytest.mark.timeout(120)
def test_ctrl_c_reaches_the_child_of_a_kept_zygote(rootfs, tmp_path):
    """The child lives in the kept zygote's PID namespace: Ctrl-C goes over the socket and
    reads as in a cold job (KeyboardInterrupt, then 130)."""
    (tmp_path / "job").mkdir()
    (tmp_path / "job/train.py").write_text(INTERRUPTED)
    settings = WarmConfig(keep_s=30.0, dir=str(tmp_path / "warm"), timeout_s=5.0)
    env, binds = {"PYTHONUNBUFFERED": "1"}, [C.Bind(str(tmp_path / "job"), "/job")]
    kept = warmkeep.prepare(settings, rootfs=str(rootfs), image="tree-1",
                            argv=["python3", "train.py"], env=env, workdir="/job",
                            binds=binds, options=C.Options(), per_run=str(tmp_path / "x"))
    assert kept is not None
    c = C.Container(rootfs=str(rootfs), argv=kept.argv, workdir="/job", env=env,
                    binds=binds + kept.binds)
    r = C.start(c, runtime="chroot", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert r.proc.stdout.readline() == b"up\n"
        r.send_signal(signal.SIGINT)
        assert r.wait() == 130 and r.proc.stdout.read() == b"interrupted\n"
        assert b"cold start" not in r.proc.stderr.read()
    finally:
        r.kill()
        warmkeep.stop(_record(settings))


def test_a_starts_own_checkpoint_is_not_part_of_the_key():
    """The checkpoint's bind (a mount, or a staged copy of its own per start) differs per
    start: not part of the key, not bound into the zygote's container; another bind is."""
    env = {"BOOTSEER_CKPT_DIR": "/ckpt", "OMP_NUM_THREADS": "1"}

    def key(*binds):
        return warmkeep.layout_key(image="t", argv=["python3", "x.py"], env=env, workdir="/",
                                   binds=list(binds), options=C.Options(), per_run="/run/x")
    code = C.Bind("/src/job", "/job")
    staged = key(code, C.Bind("/cache/mirror-1", "/ckpt"), C.Bind("/run/x/signal", "/s"))
    mounted = key(code, C.Bind("/cache/mirror-2", "/ckpt"))
    assert staged == mounted
    assert key(C.Bind("/src/other", "/job"), C.Bind("/cache/mirror-1", "/ckpt")) != staged
