"""scripts/gpu-check.sh's preflight, on a machine without a GPU: fake device nodes (mknod)
pass the device checks, and everything missing is said at once, before any work. (The
whole script was rehearsed here with GPU_CHECK_GPUS=none; see docs/gpu.md.)"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.conftest import is_root, need

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu-check.sh"


def check(tmp_path, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "GPU_CHECK_WORK": str(tmp_path / "w"),
                                           **env})


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_preflight_names_everything_missing_and_does_nothing(tmp_path):
    need(is_root(), "the script runs as root")
    (tmp_path / "dev").mkdir()
    r = check(tmp_path, str(tmp_path / "no-wheels"), GPU_CHECK_DEV=str(tmp_path / "dev"),
              TORCH_VENV=str(tmp_path / "no-venv"), UV=str(tmp_path / "no-uv"))
    assert r.returncode == 1
    errors = r.stderr.strip().splitlines()
    assert all(line.startswith("gpu-check: error: ") for line in errors), r.stderr
    text = "\n".join(errors)
    for missing in (f"no wheels in {tmp_path}/no-wheels", f"no uv at {tmp_path}/no-uv",
                    f"no Python at {tmp_path}/no-venv/bin/python",
                    f"no {tmp_path}/dev/nvidia<N> device nodes", f"no {tmp_path}/dev/nvidiactl"):
        assert missing in text, text
    assert not (tmp_path / "w").exists()     # nothing was done


def test_preflight_accepts_fake_gpu_nodes(tmp_path):
    need(is_root(), "mknod needs root")
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "x-1-py3-none-any.whl").write_bytes(b"")
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    os.symlink(sys.executable, venv / "python")
    r = check(tmp_path, str(wheels), GPU_CHECK_DEV=str(dev), TORCH_VENV=str(venv.parent),
              UV=str(tmp_path / "no-uv"))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"gpu-check: error: no uv at {tmp_path}/no-uv (set UV=)"]
