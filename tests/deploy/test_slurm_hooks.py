"""deploy/slurm/prolog.sh and epilog.sh, run as Slurm runs them (root, the job's
settings in SLURM_JOB_EXTRA or SLURM_JOB_COMMENT): the prolog warms the node (image hot
blocks in the node cache, the checkpoint staged), a failing step never fails it, a job
without bootseer settings is left alone; the epilog keeps the node under a size."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import is_root, need

DEPLOY = Path(__file__).resolve().parents[2] / "deploy/slurm"
BOOTSEER = str(Path(sys.executable).parent / "bootseer")


def hook(name: str, env: dict, tmp_path) -> tuple[int, str]:
    log = tmp_path / "hooks.log"
    r = subprocess.run(["bash", str(DEPLOY / name)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "BOOTSEER": BOOTSEER, "BOOTSEER_PROLOG_LOG": str(log),
                            "SLURM_JOB_ID": "4242", **env})
    return r.returncode, log.read_text() if log.exists() else ""


@pytest.fixture
def node_env(tmp_path):
    return {"BOOTSEER_STORE_URL": str(tmp_path / "store"),
            "BOOTSEER_CACHE_DIR": str(tmp_path / "cache")}


@pytest.mark.root
def test_prolog_warms_the_image_and_the_checkpoint(tmp_path, node_env, nginx_factory,
                                                    busybox_rootfs):
    need(is_root(), "Slurm runs its prolog as root")
    from bootseer.ckpt.staging import node_staging_dir
    from bootseer.config import BootseerConfig
    from bootseer.store import open_store
    from bootseer.store.cache import NodeCache
    from bootseer.store.fetch import Fetcher
    from bootseer.tree import profile as prof
    from bootseer.tree.reader import TreeReader
    from tests.image.test_image import oci_layout, tar_layer
    store = open_store(node_env["BOOTSEER_STORE_URL"])
    layout = tmp_path / "layout"
    oci_layout(layout, [tar_layer([("app", None, "d"),
                                   ("app/weights.bin", os.urandom(3 << 20), "f"),
                                   ("app/run.py", b"print(1)\n", "f")])])
    from bootseer.image.convert import convert
    tree = convert(str(layout), store)
    # The profile a previous start recorded: every chunk of the image is hot.
    config = BootseerConfig.from_env(env={**os.environ, **node_env})
    with Fetcher(config.fetch) as f:
        chunks = TreeReader(store, tree, f, NodeCache(config.cache)).all_chunks()
    prof.push(store, {"v": 1, "kind": "bootseer.profile", "tree": tree, "runs": 1,
                      "closed_by": "api",
                      "chunks": [[c.digest, 0.1 * i, 1, "app/weights.bin", c.size]
                                 for i, c in enumerate(chunks)]})
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(os.urandom(2 << 20))
    web = nginx_factory(ckpt)
    code, log = hook("prolog.sh", {**node_env, "SLURM_JOB_EXTRA":
                                   f"bootseer image={tree} ckpt={web.url}/ deps=/nonexistent.txt "
                                   f"prefix={tmp_path / 'env'} color=blue"}, tmp_path)
    assert code == 0, log
    assert "image: done" in log and "ckpt: done" in log, log
    assert "deps: failed" in log and "starts cold" in log    # best effort, logged
    assert "ignoring unknown setting 'color=blue'" in log
    cache = NodeCache(config.cache)
    assert all(cache.contains(c.digest) for c in chunks)
    staged = [p for p in Path(node_staging_dir(config)).rglob("*") if p.is_file()
              and p.stat().st_size == 2 << 20]
    assert staged, list(Path(node_staging_dir(config)).rglob("*"))


def test_prolog_leaves_other_jobs_alone_and_reads_the_comment(tmp_path, node_env):
    code, log = hook("prolog.sh", {**node_env, "SLURM_JOB_COMMENT": "nightly eval"}, tmp_path)
    assert (code, log) == (0, "")
    code, log = hook("prolog.sh", {**node_env, "SLURM_JOB_EXTRA": "not ours",
                                   "SLURM_JOB_COMMENT": "bootseer deps=/none.txt"}, tmp_path)
    assert code == 0 and "deps: no prefix= given; skipped" in log


def test_epilog_runs_node_housekeeping(tmp_path, node_env):
    t0 = time.time()
    code, log = hook("epilog.sh", {**node_env, "BOOTSEER_NODE_KEEP": "1G"}, tmp_path)
    assert code == 0
    assert "ckpt gc done" in log and "deps gc done" in log, log
    assert time.time() - t0 < 60
