"""The wheel as users get it: built from the repository, installed into a fresh venv with
its extras, then `bootseer doctor` and a lazy FUSE mount run from that venv alone.

Installs prefer uv's cache (``--offline``: every dependency is already cached by the
project's own ``uv sync``) and fall back to the index when the cache misses one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.image.test_image import oci_layout, tar_layer

REPO = Path(__file__).resolve().parents[2]


def uv_exe() -> str:
    return shutil.which("uv") or str(Path(sys.executable).parent / "uv")


def clean_env() -> dict[str, str]:
    """No trace of the project's venv or source tree: the wheel must stand alone."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          env=kw.pop("env", clean_env()), timeout=kw.pop("timeout", 120), **kw)


def install(python: Path, requirement: str) -> None:
    base = [uv_exe(), "pip", "install", "-q", "--python", python, requirement]
    p = run(base + ["--offline"])
    if p.returncode != 0:
        p = run(base)
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    p = run([uv_exe(), "build", "--wheel", "-q", "--out-dir", dist, REPO], cwd=dist)
    if p.returncode != 0:   # the build backend (hatchling) not cached yet
        p = run([uv_exe(), "build", "--wheel", "-q", "--out-dir", dist, REPO], cwd=dist)
    assert p.returncode == 0, p.stderr
    (whl,) = dist.glob("bootseer-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with ``bootseer[s3]`` from the wheel (what the issue's user types)."""
    root = tmp_path_factory.mktemp("venv") / "v"
    p = run([uv_exe(), "venv", "-q", "--python", sys.executable, root])
    assert p.returncode == 0, p.stderr
    install(root / "bin/python", f"bootseer[s3] @ {wheel.as_uri()}")
    return root


def test_wheel_declares_what_runs(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = z.read(meta_name).decode()
    assert "bootseer/py.typed" in names
    # the HTML report embeds its charting library and script from the package
    assert {"bootseer/report/vendor/uPlot.iife.min.js", "bootseer/report/vendor/uPlot.LICENSE",
            "bootseer/report/export_html.js"} <= set(names)
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines()
                if line.startswith("Requires-Dist:")]
    assert any(r.startswith("uv") for r in requires)
    # libtorrent is the [p2p] extra, not a requirement of every node
    assert not any(r.startswith("libtorrent") and "extra" not in r for r in requires)
    extras = {line.split(":", 1)[1].strip() for line in meta.splitlines()
              if line.startswith("Provides-Extra:")}
    assert {"s3", "gcs", "hdfs", "webhdfs", "containerd", "p2p"} <= extras


def test_wheel_metadata_is_complete_for_the_index(wheel):
    """What a package index shows: the SPDX license with its file, URLs, classifiers and
    keywords; the README with no relative link (they would point nowhere there); and only
    dependencies some module uses (aiohttp comes with fsspec's http driver)."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = z.read(meta_name).decode()
    head, _, readme = meta.partition("\n\n")
    fields = [line.split(": ", 1) for line in head.splitlines() if ": " in line]
    values: dict[str, list[str]] = {}
    for k, v in fields:
        values.setdefault(k, []).append(v)
    assert values["License-Expression"] == ["Apache-2.0"]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert {u.split(",")[0] for u in values["Project-URL"]} >= {"Homepage", "Documentation",
                                                                 "Source", "Issues"}
    assert "Operating System :: POSIX :: Linux" in values["Classifier"]
    assert "checkpoint" in values["Keywords"][0].split(",")
    requires = values["Requires-Dist"]
    assert not any(r.startswith("aiohttp") for r in requires)
    assert any(r.startswith("fsspec[http]") for r in requires)
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)", readme)
    assert targets and "bench" in readme
    assert not [t for t in targets if not re.match(r"^(https?:|#)", t)]
    assert "https://github.com/bootseer/bootseer/blob/main/docs/benchmarks.md" in targets


def test_wheel_holds_no_test_only_code(wheel):
    """The CRI stubs drive containerd like a kubelet in tests only: they stay out of the
    wheel, while the snapshotter's own gRPC stubs (the service it runs) ship."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert not [n for n in names if n.startswith("tests/") or "/cri/" in n]
    assert not [n for n in names if "api_pb2" in n]
    assert {"bootseer/snapshotter/proto/snapshots_pb2.py",
            "bootseer/snapshotter/proto/snapshots_pb2_grpc.py"} <= set(names)


def test_fresh_venv_runs_doctor_from_the_wheel(venv, tmp_path):
    py = venv / "bin/python"
    where = run([py, "-c", "import bootseer, s3fs; print(bootseer.__file__)"], cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(venv))   # not the repository's src/
    p = run([venv / "bin/bootseer", "doctor", "--json"], cwd=tmp_path,
            env={**clean_env(), "BOOTSEER_STORE_URL": str(tmp_path / "store")})
    assert p.returncode in (0, 1), p.stderr          # 1: a required check failed on this node
    report = json.loads(p.stdout)
    assert report["schema"] == 1
    checks = {c["name"]: c for c in report["checks"]}
    # uv comes with the wheel (a runtime dependency), next to the venv's python
    assert checks["uv"]["ok"], checks["uv"]
    assert (venv / "bin/uv").exists()


def test_fresh_venv_mounts_a_converted_tree_lazily(need_fuse, venv, tmp_path):
    layout = tmp_path / "layout"
    layout.mkdir()
    payload = os.urandom(200_000)
    oci_layout(layout, [tar_layer([("app", None, "d"), ("app/model.bin", payload, "f")])])
    store = tmp_path / "store"
    bootseer = venv / "bin/bootseer"
    conv = run([bootseer, "image", "convert", layout, "--store", store], cwd=tmp_path)
    assert conv.returncode == 0, conv.stderr
    tree = conv.stdout.strip().splitlines()[-1]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**clean_env(), "BOOTSEER_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.Popen([str(bootseer), "image", "mount", tree, str(mnt), "--store", str(store)],
                         env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.time() + 30
        while not os.path.ismount(mnt):
            assert p.poll() is None and time.time() < deadline, p.stderr.read()
            time.sleep(0.05)
        assert (mnt / "app/model.bin").read_bytes() == payload
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert not os.path.ismount(mnt)
