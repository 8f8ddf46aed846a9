"""deploy/slurm/prolog.sh and epilog.sh run as slurmd runs them (root, the job in
SLURM_JOB_*, no PATH, the site's settings in a file), without a cluster: the prolog warms
the node for a job of root's own (image hot blocks in the node cache, the checkpoint
staged), refuses what it will not do in one line, leaves other jobs alone, and fails only
for a node fault; the epilog keeps the node under a size. The policy (what a job's
settings may name) is tested as functions. Under a real slurmd: test_slurm_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer.slurm import policy
from tests.conftest import is_root, need

DEPLOY = Path(__file__).resolve().parents[2] / "deploy/slurm"
BOOTSEER = str(Path(sys.executable).parent / "bootseer")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def hook(name: str, env: dict, tmp_path, site: dict | None = None) -> tuple[int, str, str]:
    """Run deploy/slurm/NAME as slurmd would; (exit status, the node log, the notes the task
    prolog would hand the job)."""
    log = tmp_path / "hooks.log"
    conf = tmp_path / "slurm.toml"
    settings = {"log": str(log), "state": str(tmp_path / "state"),
                "users": str(tmp_path / "users"), "bootseer": BOOTSEER,
                "path": f"{Path(sys.executable).parent}:/usr/bin:/bin", **(site or {})}
    conf.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    r = subprocess.run(["bash", str(DEPLOY / name)], check=False, capture_output=True, text=True,
                       timeout=300,
                       env={"BOOTSEER": BOOTSEER, "BOOTSEER_SLURM_CONFIG": str(conf),
                            "PYTHONPATH": SRC, "SLURM_JOB_ID": "4242", **env})
    notes = tmp_path / "state/4242/task-prolog"
    return (r.returncode, (log.read_text() if log.exists() else "") + r.stderr,
            notes.read_text() if notes.exists() else "")


@pytest.fixture
def node_env(tmp_path):
    return {"store": str(tmp_path / "store"), "cache": str(tmp_path / "cache")}


ROOT_JOB = {"SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root"}


@pytest.mark.root
def test_prolog_warms_the_image_and_the_checkpoint(tmp_path, node_env, nginx_factory):
    need(is_root(), "Slurm runs its prolog as root")
    from bootseer.config import BootseerConfig
    from bootseer.store import open_store
    from bootseer.store.cache import NodeCache
    from bootseer.store.fetch import Fetcher
    from bootseer.tree import profile as prof
    from bootseer.tree.reader import TreeReader
    from tests.image.test_image import oci_layout, tar_layer
    store = open_store(node_env["store"])
    layout = tmp_path / "layout"
    oci_layout(layout, [tar_layer([("app", None, "d"),
                                   ("app/weights.bin", os.urandom(3 << 20), "f"),
                                   ("app/run.py", b"print(1)\n", "f")])])
    from bootseer.image.convert import convert
    tree = convert(str(layout), store)
    # The profile a previous start recorded: every chunk of the image is hot.
    config = BootseerConfig.from_env(overrides={"store": {"url": node_env["store"]},
                                                "cache": {"dir": node_env["cache"]}})
    with Fetcher(config.fetch) as f:
        chunks = TreeReader(store, tree, f, NodeCache(config.cache)).all_chunks()
    hot = [[c.digest, 0.1 * i, 1, "app/weights.bin", c.size] for i, c in enumerate(chunks)]
    prof.push(store, {"v": 1, "kind": "bootseer.profile", "tree": tree, "runs": 1,
                      "closed_by": "api", "chunks": hot})
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(os.urandom(2 << 20))
    web = nginx_factory(ckpt)
    code, log, notes = hook("prolog.sh", {**ROOT_JOB, "SLURM_JOB_EXTRA":
                                          f"bootseer image={tree} ckpt={web.url}/ "
                                          f"deps=/nonexistent.txt prefix={tmp_path / 'env'} "
                                          "color=blue"}, tmp_path, node_env)
    assert code == 0, log
    assert "image: done" in log and "ckpt: done" in log, log
    assert "deps=/nonexistent.txt refused: cannot read" in log    # best effort, logged
    assert "ignoring unknown setting 'color=blue'" in log
    assert "print bootseer prolog: image: done" in notes and "refused" in notes, notes
    assert f"export BOOTSEER_CACHE_DIR={tmp_path}/users/0/cache" in notes
    cache = NodeCache(config.cache)
    assert all(cache.contains(c.digest) for c in chunks)
    # a root job's checkpoint is staged in root's own area, like any user's
    staged = [p for p in (tmp_path / "users/0").rglob("*") if p.is_file()
              and p.stat().st_size == 2 << 20]
    assert staged, list((tmp_path / "users").rglob("*"))


def test_prolog_leaves_other_jobs_alone_and_reads_the_comment(tmp_path):
    code, log, notes = hook("prolog.sh", {**ROOT_JOB, "SLURM_JOB_COMMENT": "nightly eval"},
                            tmp_path)
    assert (code, log, notes) == (0, "", "")
    code, log, notes = hook("prolog.sh", {**ROOT_JOB, "SLURM_JOB_EXTRA": "not ours",
                                          "SLURM_JOB_COMMENT": "bootseer deps=/none.txt"},
                            tmp_path)
    assert code == 0 and "deps= refused: no prefix= given" in log, log
    assert "print bootseer prolog: deps= refused" in notes


def test_prolog_fails_only_for_a_node_fault(tmp_path):
    """A broken site file is the node's fault (Slurm drains it until an admin looks); a job
    whose user this node does not know is not."""
    code, log, _ = hook("prolog.sh", {**ROOT_JOB, "SLURM_JOB_COMMENT": "bootseer image=x"},
                        tmp_path, {"timeout": "soon"})
    assert code == 1 and "node fault" in log and "timeout must be" in log, log
    code, log, notes = hook("prolog.sh", {"SLURM_JOB_UID": "4000000", "SLURM_JOB_GID": "1",
                                          "SLURM_JOB_COMMENT": "bootseer image=x"}, tmp_path)
    assert code == 0 and "no job user" in log and "no job user" in notes, log


def test_epilog_runs_node_housekeeping(tmp_path, node_env):
    t0 = time.time()
    code, log, _ = hook("epilog.sh", ROOT_JOB, tmp_path, {**node_env, "keep": "1G"})
    assert code == 0, log
    assert "ckpt gc done as root" in log and "deps gc done as root" in log, log
    assert time.time() - t0 < 60


# -- the policy ------------------------------------------------------------------------

SITE = policy.Site.load("/nonexistent", default_bootseer="/usr/bin/bootseer")
ALICE = policy.User("alice", 1000, 1000, "/home/alice")


@pytest.mark.parametrize("settings, said", [
    ("prefix=/etc/x deps=/home/alice/r.txt", "prefix=/etc/x refused: a system directory"),
    ("prefix=/ deps=/home/alice/r.txt", "prefix=/ refused"),
    ("prefix=/home/alice/../../etc deps=/home/alice/r.txt", "not a canonical path"),
    ("prefix=relative deps=/home/alice/r.txt", "not an absolute path"),
    ("deps=/home/alice/r.txt;rm prefix=/home/alice/e", "not an absolute path of letters"),
    ("deps=/home/alice/r.sh prefix=/home/alice/e", "a spec is a requirements file"),
    ("image=--store=/tmp/x", "an image is a tree digest"),
    ("image=$(id)", "an image is a tree digest"),
    ("image=a`id`", "an image is a tree digest"),
    ("image=sha256:../../x", "a digest is sha256: and 64"),
    ("ckpt=http://u:p@h/c/", "credentials in the URL"),
    ("ckpt=http://h/c/?X-Amz-Signature=s", "no query"),
    ("ckpt=ftp://h/c/", "scheme ftp:// is not allowed"),
    ("ckpt=/home/alice/../../root/c", "not a canonical path"),
    ("image=a image=b", "image= given twice"),
    ("deps=/home/alice/r.txt", "deps= refused: no prefix= given"),
])
def test_hostile_settings_are_refused(settings, said):
    r = policy.parse(settings, SITE, ALICE)
    assert any(said in line for line in r.refused), r.refused
    assert not (r.deps and r.prefix) or "prefix" not in said


def test_settings_that_pass_and_the_site_allow_list():
    r = policy.parse("image=reg.example:5000/team/train:v3 deps=/home/alice/run/requirements.txt "
                     "prefix=/home/alice/envs/train ckpt=s3://bucket/run7/step-12000", SITE, ALICE)
    assert (r.image, r.deps, r.prefix, r.ckpt, r.refused) == (
        "reg.example:5000/team/train:v3", "/home/alice/run/requirements.txt",
        "/home/alice/envs/train", "s3://bucket/run7/step-12000", ())
    strict = policy.Site(**{**SITE.__dict__, "prefixes": ("/scratch/{user}", "{home}/envs")})
    assert policy.parse("deps=/home/alice/r.txt prefix=/scratch/alice/e", strict, ALICE).prefix
    r = policy.parse("deps=/home/alice/r.txt prefix=/scratch/bob/e", strict, ALICE)
    assert r.prefix is None and r.deps is None and "not under a directory" in r.refused[0]
    assert "skipped: its prefix= was refused" in r.refused[1]
    r = policy.parse("bad\x1b[2Jsettings", SITE, ALICE)
    assert r.refused and "control" in r.refused[0]
    assert policy.job_settings("not ours", "bootseer image=x") == "image=x"
    assert policy.job_settings("bootseer image=y", "bootseer image=x") == "image=y"
    assert policy.job_settings(None, "nightly") is None


@pytest.mark.parametrize("name, text, said", [
    ("r.txt", "-e /home/alice/src\n", "an editable install"),
    ("r.txt", "./pkg\n", "a local path"),
    ("r.txt", "pkg @ file:///home/alice/pkg\n", "a local source"),
    ("r.txt", "pkg @ git+https://example.com/x.git\n", "a VCS source"),
    ("r.txt", "--index-url http://evil.example/simple\nx\n", "is not one this site allows"),
    ("r.txt", "--extra-index-url=http://evil.example/simple\nx\n", "is not one this site allows"),
    ("r.txt", "-f /home/alice/wheels\nx\n", "find-links"),
    ("r.txt", "-r ../../etc/other.txt\n", "an include outside"),
    ("r.txt", "pkg @ https://evil.example/pkg.whl\n", "a direct URL outside"),
    ("uv.lock", '[[package]]\nname = "x"\nsource = { editable = "." }\n', "a editable source"),
    ("uv.lock", '[[package]]\nname = "x"\nsource = { git = "https://e/x" }\n', "a git source"),
    ("uv.lock", '[[package]]\nname = "x"\nsource = { registry = "http://evil/simple" }\n',
     "is not one this site allows"),
    ("pyproject.toml", '[project]\nname = "p"\ndependencies = ["x @ file:///tmp/x"]\n',
     "a local source"),
    ("pyproject.toml", '[project]\nname = "p"\n[tool.uv.sources]\nx = { path = "../x" }\n',
     "a path source"),
])
def test_specs_that_name_local_or_foreign_sources_are_refused(tmp_path, name, text, said):
    spec = tmp_path / name
    spec.write_text(text)
    report = policy.check_spec(str(spec), ("https://pypi.example/simple",))
    assert any(said in p for p in report.problems), report.problems


def test_specs_from_the_allowed_index_pass(tmp_path):
    allowed = ("https://pypi.example/simple",)
    (tmp_path / "base.txt").write_text("numpy==2.0 --hash=sha256:abc\n")
    spec = tmp_path / "requirements.txt"
    spec.write_text("# pinned\n--index-url https://pypi.example/simple\n-r base.txt\n"
                    "torch==2.4 ; python_version >= '3.10' \\\n    --hash=sha256:def\n")
    assert policy.check_spec(str(spec), allowed).problems == ()
    lock = tmp_path / "uv.lock"
    lock.write_text('[[package]]\nname = "p"\nsource = { virtual = "." }\n'
                    '[[package]]\nname = "x"\n'
                    'source = { registry = "https://pypi.example/simple" }\n')
    assert policy.check_spec(str(lock), allowed).problems == ()
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    assert "not a regular file" in policy.check_spec(str(fifo), allowed).problems[0]


def test_task_prolog_prints_the_notes_once_and_exports_to_every_step(tmp_path):
    notes = tmp_path / "state/7/task-prolog"
    notes.parent.mkdir(parents=True)
    notes.write_text("print bootseer prolog: image: done in 1.0 s (as root)\n"
                     "export BOOTSEER_CACHE_DIR=/var/lib/bootseer/users/1000/cache\n")

    def task(**env) -> str:
        return subprocess.run(["sh", str(DEPLOY / "task-prolog.sh")], check=True,
                              capture_output=True, text=True,
                              env={"BOOTSEER_SLURM_STATE": str(tmp_path / "state"),
                                   "SLURM_JOB_ID": "7", **env}).stdout
    assert task() == notes.read_text()                       # the batch step
    assert task(SLURM_STEP_ID="0") == \
        "export BOOTSEER_CACHE_DIR=/var/lib/bootseer/users/1000/cache\n"   # each srun step
    assert task(SLURM_JOB_ID="8") == ""                       # a job the prolog left nothing for
