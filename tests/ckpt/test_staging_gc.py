"""``bootseer ckpt gc``: the node's staging directory kept under a size, least recently used
first, never a file a live engine may use or a job holds as a hard link."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer.ckpt.staging import MARKER, StagingArea, gc, node_staging_dir, staged_name
from bootseer.config import BootseerConfig
from bootseer.errors import CacheError

MiB = 1 << 20


def staged(d, key: str, age_s: float, size: int = MiB) -> str:
    name = staged_name(key)
    (d / name).write_bytes(b"x" * size)
    (d / f"{name}.complete").touch()
    t = time.time() - age_s
    os.utime(d / name, (t, t))
    return name


def test_least_recently_used_go_first_until_the_rest_fit(tmp_path):
    d = StagingArea(tmp_path / "ckpt").dir   # made by bootseer: marked as its own
    old, mid, new = (staged(d, k, age) for k, age in (("a", 300), ("b", 200), ("c", 100)))
    (d / "profiles-v1").mkdir()   # not a staged file: never touched
    report = {name: action for name, _, _, action in gc(d, MiB + MiB // 2)}
    assert report == {old: "removed", mid: "removed", new: "kept"}
    assert sorted(p.name for p in d.iterdir()) == sorted([new, f"{new}.complete", MARKER,
                                                          ".gc.lock", "profiles-v1"])


def test_files_a_live_engine_took_up_or_a_job_links_are_spared(tmp_path):
    d = StagingArea(tmp_path / "ckpt").dir
    a, b, c, e = (staged(d, k, age) for k, age in
                  (("a", 400), ("b", 300), ("c", 200), ("e", 100)))
    os.link(d / e, tmp_path / "job-copy")          # bootseer run handed it to a job
    (d / ".engines").mkdir()
    (d / ".engines/999999999-1").touch()            # a dead engine's registration
    area = StagingArea(d)
    area.register()                                 # a live engine (this process) ...
    try:
        area.file("b", MiB, MiB)                    # ... that took up b
        report = {name: action for name, _, _, action in gc(d, 0, dry_run=True)}
        assert report == {a: "would remove", b: "in use (a live engine may read it)",
                          c: "would remove", e: "in use (a job holds it as a hard link)"}
        assert (d / a).exists() and not (d / ".engines/999999999-1").exists()
    finally:
        area.close()
    assert not list((d / ".engines").iterdir())     # closed: no longer registered
    report = {name: action for name, _, _, action in gc(d, 0)}
    assert report[b] == "removed" and not (d / b).exists() and not (d / f"{b}.complete").exists()


def test_cli_gc_dry_run_says_and_keeps(tmp_path):
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache/blobs")}
    d = StagingArea(node_staging_dir(BootseerConfig.from_env(env))).dir
    name = staged(d, "k", 60)
    r = subprocess.run([sys.executable, "-m", "bootseer", "ckpt", "gc", "--max-size", "0",
                        "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("would remove\t1 MiB\t" + name) and (d / name).exists()


def test_the_staging_directory_is_a_setting_of_its_own(tmp_path):
    env = {"BOOTSEER_CACHE_DIR": str(tmp_path / "c"), "BOOTSEER_CKPT_STAGING_DIR": "rel/st"}
    staging = node_staging_dir(BootseerConfig.from_env(env))
    assert staging == Path(os.path.abspath("rel/st"))


def test_the_staging_directory_is_never_a_users_ckpt_folder_next_to_the_cache(tmp_path):
    """BOOTSEER_CACHE_DIR=/data/cache with the user's checkpoints in /data/ckpt: bootseer
    neither stages into nor trims the user's folder."""
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "data/cache")}
    users = tmp_path / "data/ckpt"
    users.mkdir(parents=True)
    mine = staged(users, "the user's own file, named like a staged one", 600)
    staging = node_staging_dir(BootseerConfig.from_env(env))
    assert staging == tmp_path / "data/cache/ckpt-staging"   # inside the cache dir
    StagingArea(staging).file("k", MiB, MiB).write(0, b"x" * MiB)
    r = subprocess.run([sys.executable, "-m", "bootseer", "ckpt", "gc", "--max-size", "0"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert staged_name("k") in r.stdout and not (staging / staged_name("k")).exists()
    assert sorted(p.name for p in users.iterdir()) == sorted([mine, f"{mine}.complete"])


def test_gc_removes_nothing_from_a_directory_bootseer_did_not_make(tmp_path):
    users = tmp_path / "given"
    users.mkdir()
    name = staged(users, "k", 600)
    area = StagingArea(users)        # an engine may stage into a directory it was given ...
    area.close()
    assert not (users / MARKER).exists()
    with pytest.raises(CacheError, match="did not make"):   # ... gc never trims it
        gc(users, 0)
    assert (users / name).exists() and (users / f"{name}.complete").exists()
    made = StagingArea(tmp_path / "made/staging")
    assert (made.dir / MARKER).is_file()
