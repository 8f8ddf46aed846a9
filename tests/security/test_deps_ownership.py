"""Issue 18 item 6: bootseer removes an environment only when the marker proves it made
it and nothing uses it. ``deps gc`` removed a recorded prefix a user had since replaced;
a stale ``<prefix>.mount.json`` let ``ensure`` delete a user's directory; ``ensure`` of
another key replaced an environment a running job used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from bootseer.deps import ensure as E
from bootseer.deps.gc import gc, records_dir
from bootseer.deps.prefix import read_marker, sidecar
from bootseer.deps.resolve import DepsError
from tests.deps.test_deps import cfg, serve_index

pytestmark = pytest.mark.timeout(240)
PY = sys.executable


@pytest.fixture
def index(nginx_factory, tmp_path):
    urls, spec = serve_index(nginx_factory, tmp_path, [("bsown_a", "1.0", "X = 'a'\n"),
                                                       ("bsown_b", "1.0", "X = 'b'\n")],
                             "bsown-a==1.0\n")
    other = tmp_path / "other.txt"
    other.write_text("bsown-b==1.0\n")
    return urls, str(spec), str(other)


def user_data(path) -> None:
    os.makedirs(path)
    with open(os.path.join(path, "thesis.tex"), "w") as f:
        f.write("years of work")


def kept(path) -> bool:
    return open(os.path.join(path, "thesis.tex")).read() == "years of work"


@pytest.mark.parametrize("copied_marker", [False, True])
def test_gc_leaves_a_prefix_the_user_replaced(index, tmp_path, copied_marker):
    urls, spec, _ = index
    config = cfg(tmp_path, "n1")
    prefix = str(tmp_path / "envs/a")
    E.ensure(spec, prefix, python=PY, index_urls=urls, config=config)
    shutil.copytree(prefix, tmp_path / "backup", symlinks=True)
    subprocess.run(["rm", "-rf", prefix], check=True)       # the user takes the path back
    if copied_marker:      # ... with a copy of the environment, marker included, then data
        shutil.copytree(tmp_path / "backup", prefix, symlinks=True)
        with open(os.path.join(prefix, "thesis.tex"), "w") as f:
            f.write("years of work")
    else:
        user_data(prefix)
    report = {e.prefix: a for e, a in gc(config, 0)}
    assert report[prefix].startswith("forgotten, not removed"), report
    assert kept(prefix)
    assert not list(records_dir(config).glob("*.json"))      # not considered again
    assert gc(config, 0) == []


def test_gc_still_removes_its_own_unused_environment(index, tmp_path):
    urls, spec, _ = index
    config = cfg(tmp_path, "n1")
    prefix = str(tmp_path / "envs/a")
    E.ensure(spec, prefix, python=PY, index_urls=urls, config=config)
    assert {e.prefix: a for e, a in gc(config, 0)} == {prefix: "removed"}
    assert not os.path.exists(prefix)
    assert not [n for n in os.listdir(tmp_path / "envs") if not n.endswith(".lock")]


def test_a_stale_mount_sidecar_does_not_make_a_users_directory_ours(index, tmp_path):
    urls, spec, _ = index
    prefix = str(tmp_path / "mine")
    user_data(prefix)
    with open(sidecar(prefix), "w") as f:     # left by a lazy mount long gone
        json.dump({"key": "sha256:" + "1" * 64, "tree": "sha256:" + "2" * 64, "pid": 999999}, f)
    with pytest.raises(DepsError, match="not made by bootseer"):
        E.ensure(spec, prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n1"))
    assert kept(prefix) and sorted(os.listdir(prefix)) == ["thesis.tex"]


def test_ensure_of_another_key_never_replaces_an_environment_in_use(index, tmp_path):
    urls, spec, other = index
    config = cfg(tmp_path, "n1")
    prefix = str(tmp_path / "env")
    a = E.ensure(spec, prefix, python=PY, index_urls=urls, config=config)
    job = subprocess.Popen([f"{prefix}/bin/python", "-c", "import bsown_a, time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        with pytest.raises(DepsError, match=f"in use by pid {job.pid}"):
            E.ensure(other, prefix, python=PY, index_urls=urls, config=config)
        assert read_marker(prefix)["key"] == a.key
        assert job.poll() is None
    finally:
        job.kill()
        job.wait()
    # free now; another ensure of the prefix waiting meanwhile (its command line names the
    # prefix as --prefix P) is not a user
    waiter = subprocess.Popen([PY, "-c", "import time; time.sleep(60)", "--prefix", prefix])
    try:
        time.sleep(0.3)
        b = E.ensure(other, prefix, python=PY, index_urls=urls, config=config)
    finally:
        waiter.kill()
        waiter.wait()
    assert b.how == "built" and read_marker(prefix)["key"] == b.key
    out = subprocess.run([f"{prefix}/bin/python", "-c", "import bsown_b; print(bsown_b.X)"],
                         capture_output=True, text=True).stdout.strip()
    assert out == "b"
