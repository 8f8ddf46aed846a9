"""``deps gc`` from a container's PID namespace (``unshare --pid --fork --mount-proc``, as
a pod without hostPID): it refuses in one line, and with the node's /proc given
(``--host-proc``) it keeps the environment a host process uses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from bootseer.deps import ensure as E
from tests.conftest import is_root, need
from tests.deps.test_deps import cfg
from tests.deps.test_deps_node import index, run_py  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(240)
PY = sys.executable


def test_gc_in_a_pid_namespace_of_its_own_sees_the_node_or_refuses(index, tmp_path):  # noqa: F811
    need(is_root() and shutil.which("unshare") is not None, "needs root and unshare")
    urls, spec = index
    prefix = str(tmp_path / "envs/busy")
    E.ensure(spec, prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n1"))
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "n1/cache")}
    host_proc = tmp_path / "hostproc"   # the node's /proc, as a pod would mount it
    host_proc.mkdir()
    subprocess.run(["mount", "--bind", "/proc", str(host_proc)], check=True)
    user = subprocess.Popen([f"{prefix}/bin/python", "-c", "import time; time.sleep(120)"])
    pod = ["unshare", "--pid", "--fork", "--mount-proc", PY, "-m", "bootseer", "deps", "gc",
           "--max-size", "0"]

    def gc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*pod, *args], capture_output=True, text=True, timeout=120,
                              env=env)
    try:
        r = gc()
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "PID namespace of its own" in r.stderr and "--host-proc" in r.stderr
        r = gc("--host-proc", str(tmp_path))
        assert r.returncode == 2 and "not a /proc" in r.stderr, r.stderr
        r = gc("--host-proc", str(host_proc))
        assert r.returncode == 0 and f"in use (pid {user.pid})" in r.stdout, r.stdout + r.stderr
        assert run_py(prefix, "import bsnode_one; print(bsnode_one.X)") == "1"
        user.kill()
        user.wait()
        r = gc("--host-proc", str(host_proc))   # nobody uses it now: it goes
        assert r.returncode == 0 and r.stdout.startswith("removed"), r.stdout + r.stderr
        assert not os.path.exists(prefix)
    finally:
        user.kill()
        user.wait()
        subprocess.run(["umount", str(host_proc)], check=True)
