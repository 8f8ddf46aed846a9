"""deploy/slurm under Slurm itself: a one-node cluster (munged, slurmctld, slurmd from
Debian's slurm-wlm, started for the session and stopped by PID) runs sbatch jobs of an
ordinary user with the prolog, epilog and task prolog configured as docs/slurm.md says.

Checked: an environment built by an earlier job (as its user) is restored for the next;
the image is prefetched into the node cache (as root), the checkpoint staged in the user's
area (as the user); the prolog's steps and the job land in the job's trace; the epilog's
gc runs; hostile settings are refused with a line in the job's output, nothing of them runs
and the node stays usable; a step that overruns the site's limit leaves the node usable."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import need
from tests.deploy import slurm_cluster

REPO = Path(__file__).resolve().parents[2]
USER = "bs-slurm-test"
# root (slurmd, useradd), servers (munged, slurmctld, slurmd, nginx)
pytestmark = [pytest.mark.root, pytest.mark.servers, pytest.mark.timeout(300)]


@dataclass
class Env:
    base: Path
    cluster: slurm_cluster.Cluster
    user: pwd.struct_passwd
    bootseer: str
    site: Path
    store: Path
    cache: Path
    users: Path
    traces: Path
    log: Path

    def write_site(self, **overrides) -> None:
        settings = {"bootseer": self.bootseer, "path": f"{self.base}/venv/bin:/usr/bin:/bin",
                    "store": str(self.store), "cache": str(self.cache), "users": str(self.users),
                    "state": str(self.base / "state"), "log": str(self.log), "timeout": 60,
                    "keep": "1G", "trace": str(self.traces), **overrides}
        self.site.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))

    def sbatch(self, comment: str | None, script: str) -> str:
        """Submit ``script`` as the test user with ``comment`` (None: the script's own
        #SBATCH --comment); the job's id."""
        home = Path(self.user.pw_dir)
        path = home / f"job-{time.monotonic_ns()}.sbatch"
        path.write_text(script)
        os.chown(path, self.user.pw_uid, self.user.pw_gid)
        given = ["--comment", comment] if comment is not None else []
        r = subprocess.run(["runuser", "-u", USER, "--", "sbatch", "--parsable", *given,
                            "-o", f"{home}/out-%j.txt", "-D", str(home), str(path)],
                           check=False, capture_output=True, text=True, timeout=30,
                           env={"PATH": os.environ["PATH"], **self.cluster.env})
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().split(";")[0]

    def run(self, comment: str | None, script: str = "#!/bin/bash\necho ran\n") -> tuple[dict, str]:
        return self.finish(self.sbatch(comment, script))

    def finish(self, job: str) -> tuple[dict, str]:
        """Wait for ``job`` to end; its fields and its output."""
        fields = self.cluster.wait_job(job)
        out = Path(self.user.pw_dir) / f"out-{job}.txt"
        return {**fields, "id": job}, out.read_text() if out.exists() else ""

    def log_of(self, job: str) -> str:
        """The node log's lines about ``job`` (its steps' own output is untagged)."""
        return "".join(line for line in self.log.read_text().splitlines(keepends=True)
                       if f" job {job}: " in line)


def _make_user(home: Path) -> pwd.struct_passwd:
    subprocess.run(["userdel", USER], check=False, capture_output=True)   # one a killed run left
    subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/bash", USER], check=True,
                   capture_output=True)
    user = pwd.getpwnam(USER)
    home.mkdir(mode=0o755)
    os.chown(home, user.pw_uid, user.pw_gid)
    return user


def _make_venv(dest: Path) -> str | None:
    """An interpreter with bootseer's dependencies that any user can run (this session's
    may live under a private home), from uv's cache; why not (None: made)."""
    uv = shutil.which("uv")
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else None
    if uv is None or py is None:
        return "no uv or /usr/bin/python3 to make an interpreter the job's user can run"
    r = subprocess.run([uv, "venv", "-q", "-p", py, str(dest)], check=False, capture_output=True,
                       text=True)
    if r.returncode == 0:
        r = subprocess.run([uv, "pip", "install", "-q", "--offline", "--python",
                            str(dest / "bin/python"), "fsspec", "zstandard", "mfusepy", "tqdm",
                            "aiohttp", "uv"], check=False, capture_output=True, text=True)
    return None if r.returncode == 0 else f"cannot make the user's interpreter: {r.stderr[-300:]}"


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="session")
def slurm():
    why = slurm_cluster.available()
    need(why is None, why or "")
    base = Path(tempfile.mkdtemp(prefix="bs-slurm-"))
    base.chmod(0o755)
    cluster = None
    try:
        why = _make_venv(base / "venv")
        need(why is None, why or "")
        user = _make_user(base / "home")
        (base / "bin").mkdir()
        bootseer = _script(base / "bin/bootseer", f"#!/bin/sh\nPYTHONPATH={REPO}/src exec "
                                                  f"{base}/venv/bin/python -m bootseer \"$@\"\n")
        site = base / "slurm.toml"
        hook = (f"#!/bin/sh\nexport BOOTSEER={bootseer} BOOTSEER_SLURM_CONFIG={site}\n"
                f"exec {REPO}/deploy/slurm/%s\n")
        prolog = _script(base / "bin/prolog", hook % "prolog.sh")
        epilog = _script(base / "bin/epilog", hook % "epilog.sh")
        task = _script(base / "bin/task-prolog",
                       f"#!/bin/sh\nexport BOOTSEER_SLURM_STATE={base}/state\n"
                       f"exec {REPO}/deploy/slurm/task-prolog.sh\n")
        for d in ("store", "traces"):   # shared: every user publishes and records there
            (base / d).mkdir(mode=0o777)
            (base / d).chmod(0o1777)
        env = Env(base, None, user, bootseer, site, base / "store", base / "cache",  # type: ignore[arg-type]
                  base / "users", base / "traces", base / "log/prolog.log")
        env.write_site()
        cluster = slurm_cluster.Cluster(base / "cluster", prolog, epilog, task, prolog_timeout=30)
        cluster.write()
        cluster.start()
        env.cluster = cluster
        yield env
    finally:
        if cluster is not None:
            cluster.stop()
        subprocess.run(["userdel", USER], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def sources(slurm):
    """An image converted into the store with its hot-block profile, a package index, a
    checkpoint served over http: what a site's users would name."""
    from bootseer.demo.assets import write_simple_index
    from bootseer.image.convert import convert
    from bootseer.store import open_store
    from bootseer.testing import servers
    from tests.image.test_image import oci_layout, tar_layer
    from tests.run.test_baseline import make_wheel
    base = slurm.base
    store = open_store(str(slurm.store))
    layout = oci_layout(base / "layout", [tar_layer([
        ("app", None, "d"), ("app/weights.bin", os.urandom(3 << 20), "f"),
        ("app/run.py", b"print(1)\n", "f")])])
    tree = convert(str(layout), store)
    _push_profile(store, tree, slurm)
    www = base / "www"
    (www / "index/wheels").mkdir(parents=True)
    make_wheel(www / "index/wheels", "bsdeps_one", "1.0", "X = 1\n")
    write_simple_index(www / "index")
    (www / "ckpt").mkdir()
    (www / "ckpt/model.pt").write_bytes(os.urandom(2 << 20))
    subprocess.run(["chmod", "-R", "a+rX", str(www)], check=True)
    subprocess.run(["chmod", "-R", "a+rwX", str(slurm.store)], check=True)
    web = servers.start_nginx(www, base / "nginx")
    try:
        yield {"tree": tree, "index": f"{web.url}/index/simple", "ckpt": f"{web.url}/ckpt/"}
    finally:
        web.stop()


def _push_profile(store, tree: str, env: Env) -> None:
    """The profile a previous start recorded: every chunk of the image is hot."""
    from bootseer.config import BootseerConfig
    from bootseer.store.cache import NodeCache
    from bootseer.store.fetch import Fetcher
    from bootseer.tree import profile as prof
    from bootseer.tree.reader import TreeReader
    config = BootseerConfig.from_env(overrides={"store": {"url": str(env.store)},
                                                "cache": {"dir": str(env.base / "scratch")}})
    with Fetcher(config.fetch) as f:
        chunks = TreeReader(store, tree, f, NodeCache(config.cache)).all_chunks()
    hot = [[c.digest, 0.1 * i, 1, "app/weights.bin", c.size] for i, c in enumerate(chunks)]
    prof.push(store, {"v": 1, "kind": "bootseer.profile", "tree": tree, "runs": 1,
                      "closed_by": "api", "chunks": hot})
    shutil.rmtree(env.base / "scratch")


def _user_file(env: Env, name: str, text: str) -> str:
    path = Path(env.user.pw_dir) / name
    path.write_text(text)
    os.chown(path, env.user.pw_uid, env.user.pw_gid)
    return str(path)


TRAIN = """#!/usr/bin/env bash
#SBATCH --job-name=train
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --comment="bootseer image={tree} deps={spec} prefix={prefix} ckpt={ckpt}"
set -euo pipefail
echo "cache=$BOOTSEER_CACHE_DIR trace=$BOOTSEER_TRACE_LOCATION job=$BOOTSEER_TRACE_JOB_ID"
srun --kill-on-bad-exit=1 bash -c '
exec {bootseer} run --deps {spec} --prefix {prefix} --ckpt {ckpt} \\
    --job-id "$SLURM_JOB_ID" --node "$(hostname)" \\
    -- {prefix}/bin/python -c "import bsdeps_one, os; print(\\"X\\", bsdeps_one.X); \\
print(\\"ckpt\\", os.listdir(os.environ[\\"BOOTSEER_CKPT_DIR\\"]))"
'
"""

def test_jobs_are_warmed_as_root_and_as_their_user(slurm, sources):
    env = slurm
    home = env.user.pw_dir
    spec = _user_file(env, "requirements.txt",
                      f"--index-url {sources['index']}\nbsdeps-one==1.0\n")
    env.write_site(indexes=[sources["index"]])
    # An earlier job builds the environment (as its user) and publishes it into the store.
    prefix = f"{home}/envs/train"
    first, out = env.run(f"bootseer deps={spec} prefix={prefix}")
    assert first["JobState"] == "COMPLETED", (first, out, env.log_of(first["id"]))
    assert "bootseer prolog: deps: done" in out and f"(as {USER})" in out, out
    assert "built sha256:" in env.log.read_text()

    # Another node: neither the environment nor this node's record of it.
    shutil.rmtree(prefix)
    shutil.rmtree(env.users / str(env.user.pw_uid))
    # The training job: image, environment (restored from the store), checkpoint.
    job, out = env.run(None, TRAIN.format(bootseer=env.bootseer, prefix=prefix, spec=spec,
                                          ckpt=sources["ckpt"], tree=sources["tree"]))
    log = env.log_of(job["id"])
    assert job["JobState"] == "COMPLETED", out + log
    assert "bootseer prolog: image: done" in out and "(as root)" in out, out
    assert "bootseer prolog: ckpt: done" in out and "X 1" in out, out
    assert "ckpt ['model.pt']" in out and "deps: warm" in out, out   # bootseer run, as the user
    assert "restored sha256:" in env.log.read_text(), env.log.read_text()
    assert os.stat(prefix).st_uid == env.user.pw_uid
    # The image's chunks in the node cache (root's); the checkpoint in the user's area.
    from bootseer.config import BootseerConfig
    from bootseer.store import open_store
    from bootseer.store.cache import NodeCache
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import TreeReader
    config = BootseerConfig.from_env(overrides={"store": {"url": str(env.store)},
                                                "cache": {"dir": str(env.cache)}})
    with Fetcher(config.fetch) as f:
        chunks = TreeReader(open_store(str(env.store)), sources["tree"], f,
                            NodeCache(config.cache)).all_chunks()
    cache = NodeCache(config.cache)
    assert chunks and all(cache.contains(c.digest) for c in chunks)
    area = env.users / str(env.user.pw_uid)
    assert f"cache={area}/cache" in out
    staged = [p for p in area.rglob("*") if p.is_file() and p.stat().st_size == 2 << 20]
    assert staged and all(p.stat().st_uid == env.user.pw_uid for p in staged), \
        list(area.rglob("*"))
    # The job's trace: the prolog's steps (as whom) and the job's own phase.
    events = [json.loads(line) for p in (env.traces / job["id"]).rglob("*.jsonl")
              for line in p.read_text().splitlines()]
    phases = {e["phase"]: e for e in events}
    assert {"prolog.image", "prolog.deps", "prolog.ckpt", "ckpt.staged", "job.run"} <= \
        set(phases), sorted(phases)
    assert phases["prolog.image"]["attrs"]["as"] == "root"
    assert phases["prolog.ckpt"]["attrs"]["as"] == "user"
    # The epilog: the node cache's gc as root, the user's area as the user; notes removed.
    assert "epilog: ckpt gc done as root" in log and f"epilog: deps gc done as {USER}" in log
    assert not (env.base / "state" / job["id"]).exists()
    assert slurm.cluster.node_state() == "IDLE"


IMAGE_JOB = """#!/usr/bin/env bash
#SBATCH --job-name=train-image
#SBATCH --nodes=1
set -euo pipefail
srun --kill-on-bad-exit=1 {bootseer} run --image {tree} --store {store} \\
    -- sh -c 'cat /etc/motd; id -u; exit 3' || echo "status $?"
"""


def test_an_image_job_of_an_ordinary_user_runs_without_root(slurm):
    """train.sbatch's shape under slurmd, as the job's user: `bootseer run --image` through
    srun with no root and no podman (the rootless runtime), the job's status back to
    Slurm's step, nothing left mounted, the node idle after."""
    import io
    import tarfile

    from tests.conftest import BUSYBOX, make_busybox_rootfs
    from tests.image.test_image import oci_layout
    from tests.run.test_rootless import ACL, _fuse_acl
    need(os.path.exists(BUSYBOX), "busybox-static is not installed")
    env = slurm
    rootfs = make_busybox_rootfs(env.base / "image-rootfs")
    (rootfs / "etc/motd").write_text("hello from the image\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(rootfs, arcname=".")
    from bootseer.image.convert import convert
    from bootseer.store import open_store
    tree = convert(str(oci_layout(env.base / "image-layout", [buf.getvalue()])),
                   open_store(str(env.store)))
    subprocess.run(["chmod", "-R", "a+rwX", str(env.store)], check=True)
    try:   # the node opens FUSE to this user (a site: mode 0666), no other user touched
        old: bytes | None = os.getxattr("/dev/fuse", ACL)
    except OSError:
        old = None
    mode = os.stat("/dev/fuse").st_mode & 0o7777
    os.setxattr("/dev/fuse", ACL, _fuse_acl(env.user.pw_uid))
    try:
        job, out = env.run(None, IMAGE_JOB.format(bootseer=env.bootseer, tree=tree,
                                                  store=env.store))
    finally:
        if old is None:
            os.removexattr("/dev/fuse", ACL)
        else:
            os.setxattr("/dev/fuse", ACL, old)
        os.chmod("/dev/fuse", mode)
    assert job["JobState"] == "COMPLETED", (job, out)
    lines = out.splitlines()
    assert "hello from the image" in lines and "0" in lines, out   # root inside: the user
    assert "status 3" in out, out   # the job's own status, through srun
    with open("/proc/mounts") as f:
        assert not [line for line in f if f"user_id={env.user.pw_uid}," in line]
    assert slurm.cluster.node_state() == "IDLE"


def test_hostile_settings_are_refused_and_the_node_stays_up(slurm, sources):
    env = slurm
    home = env.user.pw_dir
    marker = env.base / "pwned"
    pkg = Path(home) / "evilpkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "setup.py").write_text(f"open({str(marker)!r}, 'w').write('built')\n"
                                  "from setuptools import setup; setup(name='evil')\n")
    local = _user_file(env, "local.txt", f"-e {pkg}\n")
    foreign = _user_file(env, "foreign.txt", "--index-url http://evil.example/simple\nx\n")
    env.write_site(indexes=[sources["index"]], prefixes=["{home}/envs"])
    spec = _user_file(env, "requirements.txt", "bsdeps-one==1.0\n")
    secret = env.base / "root-only.txt"     # root can read it; the job's user cannot
    secret.write_text("bsdeps-one==1.0\n")
    secret.chmod(0o600)
    cases = {
        f"bootseer deps={secret} prefix={home}/envs/s": "Permission denied",
        f"bootseer deps={spec} prefix=/etc/bs-evil": "prefix=/etc/bs-evil refused",
        f"bootseer deps={spec} prefix={home}/elsewhere": "not under a directory this site allows",
        f"bootseer deps={local} prefix={home}/envs/l": "an editable install",
        f"bootseer deps={foreign} prefix={home}/envs/f": "is not one this site allows",
        f"bootseer image=x;touch${{IFS}}{marker}": "image=x;touch${IFS}",
        f"bootseer deps={home}/../../etc/passwd prefix={home}/envs/p": "not a canonical path",
        "bootseer ckpt=http://u:pw@host/ckpt/": "credentials in the URL",
        "bootseer ckpt=http://host/a/../../etc/": "'..' in the path",
        f"bootseer image=$(touch {marker})": "ignoring unknown setting",
        # a registry the job names is never asked by root: only the site's store
        "bootseer image=evil.example:5000/x:1": "not in this site's store",
    }
    jobs = {comment: env.sbatch(comment, "#!/bin/bash\necho ran\n") for comment in cases}
    for comment, said in cases.items():
        job, out = env.finish(jobs[comment])
        assert job["JobState"] == "COMPLETED" and "ran" in out, (comment, job, out)
        assert said in out and any(w in out for w in ("refused", "ignoring", "skipped")), \
            (comment, out)
        log = env.log_of(job["id"])
        assert ": done in" not in log and "failed" not in log, (comment, log)
    assert slurm.cluster.node_state() == "IDLE", slurm.cluster.scontrol("show", "node")
    assert not marker.exists() and not os.path.exists("/etc/bs-evil")
    assert not any(Path(home, "envs", name).exists() for name in ("l", "f", "p", "s"))

def test_a_step_past_the_limit_leaves_the_node_usable(slurm):
    env = slurm
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)   # accepts into its backlog and never answers
    env.write_site(timeout=2)
    try:
        t0 = time.time()
        job, out = env.run(f"bootseer ckpt=http://127.0.0.1:{silent.getsockname()[1]}/ckpt/")
    finally:
        silent.close()
        env.write_site()
    assert job["JobState"] == "COMPLETED" and "ran" in out, (job, out)
    assert "ckpt: stopped at the site's limit of 2 s" in out, out
    assert time.time() - t0 < 25
    assert slurm.cluster.node_state() == "IDLE"
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _uid(p) == env.user.pw_uid]
    assert not left, [(p.name, (p / "cmdline").read_bytes()) for p in left]


def _uid(p: Path) -> int | None:
    try:
        return p.stat().st_uid
    except OSError:
        return None


def test_a_node_fault_drains_the_node(slurm):
    """The one case the prolog fails on purpose: the site's file is broken. Slurm drains
    the node (as it should: every job would start cold) and holds the job; fixed and
    resumed, the node runs jobs again."""
    env = slurm
    env.site.write_text("timeout = \"soon\"\n")
    job = ""
    try:
        job = env.sbatch("bootseer image=x", "#!/bin/bash\necho ran\n")
        deadline = time.time() + 30
        # drained, and the failed start over (its epilog run, with the same broken file)
        while time.time() < deadline and ("DRAIN" not in slurm.cluster.node_state() or
                                          "COMPLETING" in slurm.cluster.node_state() or
                                          slurm.cluster.job(job).get("JobState") != "PENDING"):
            time.sleep(0.3)
        assert "DRAIN" in slurm.cluster.node_state(), slurm.cluster.scontrol("show", "node")
        assert "Prolog error" in slurm.cluster.scontrol("show", "node")
    finally:
        env.write_site()
        subprocess.run(["scancel", job], check=False, capture_output=True,
                       env={"PATH": os.environ["PATH"], **slurm.cluster.env})
        slurm.cluster.scontrol("update", f"NodeName={slurm.cluster.node}", "State=RESUME")
    deadline = time.time() + 30
    while slurm.cluster.node_state() != "IDLE" and time.time() < deadline:
        time.sleep(0.3)
    assert slurm.cluster.node_state() == "IDLE", slurm.cluster.scontrol("show", "node")
    job, out = env.run("bootseer image=sha256:" + "0" * 64)
    assert job["JobState"] == "COMPLETED" and "ran" in out, (job, out)
