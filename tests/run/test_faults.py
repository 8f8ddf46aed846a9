"""``bootseer run`` faults with the bootseer pipelines: store unreachable (falls back and
says so), SIGTERM with a lazy image mounted (nothing left), a node killed during startup
(the report says which)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import is_root, need

pytestmark = pytest.mark.timeout(240)


def bootseer(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, **kw)


@pytest.fixture
def image(registry, busybox_rootfs, tmp_path):
    need(is_root(), "containers need root")
    from tests.run.test_baseline import push_busybox
    return push_busybox(registry, busybox_rootfs, tmp_path)


def test_store_unreachable_falls_back_to_pull(need_fuse, image, tmp_path):
    env = {"BOOTSEER_STORE_URL": "http://127.0.0.1:9/store",
           "BOOTSEER_FETCH_RETRIES": "0", "BOOTSEER_CACHE_DIR": str(tmp_path / "c")}
    r = bootseer("run", "--image", image, "--summary", str(tmp_path / "s.json"), "--",
                 "sh", "-c", "test -x /bin/busybox && exit 3", env=env)
    assert r.returncode == 3, r.stderr
    assert "falling back to the conventional path" in r.stderr
    assert "fallback" in (tmp_path / "s.json").read_text()


def lazy_mounts() -> list[str]:
    return [m for m in open("/proc/mounts") if "bootseer-image" in m]


def podman_started(parent: int) -> bool:
    """The run's own podman (others may run on this machine) is up."""
    return subprocess.run(["pgrep", "-P", str(parent), "-f", "podman --root /tmp/bsr-"],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("when", ["after the mount", "while podman creates the container"])
def test_sigterm_with_lazy_image_leaves_nothing(need_fuse, image, tmp_path, when):
    store = str(tmp_path / "store")
    assert bootseer("image", "convert", image, "--to", store).returncode == 0
    before = lazy_mounts()
    # a sleep of its own length: other runs on this machine may have sleeps of their own
    nap = f"sleep {600 + os.getpid() % 3000}"
    proc = subprocess.Popen([sys.executable, "-m", "bootseer", "run", "--image", image, "--",
                             "sh", "-c", f"touch /run/bootseer/up; {nap}"],
                            env={**os.environ, "BOOTSEER_STORE_URL": store,
                                 "BOOTSEER_CACHE_DIR": str(tmp_path / "c")},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    if when == "after the mount":
        while len(lazy_mounts()) == len(before) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
    else:  # podman, signalled before its container runs, exits and leaves it to conmon
        while not podman_started(proc.pid) and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (143, 130, 1), err
    assert lazy_mounts() == before
    assert subprocess.run(["pgrep", "-f", nap], capture_output=True).stdout.strip() == b""


def test_killed_node_is_named_by_the_report(tmp_path):
    trace = tmp_path / "trace"
    env = {"BOOTSEER_TRACE_JOB_ID": "j"}
    good = bootseer("run", "--trace", str(trace), "--node", "n0", "--", "sh", "-c",
                    "touch $BOOTSEER_READY_FILE", env=env)
    assert good.returncode == 0, good.stderr
    slow = subprocess.Popen([sys.executable, "-m", "bootseer", "run", "--trace", str(trace),
                             "--node", "n1", "--", "sleep", "60"],
                            env={**os.environ, **env})
    time.sleep(1.5)
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(slow.pid)],
                                               capture_output=True, text=True).stdout.split()]
    slow.kill()                                   # killed during startup: never ready
    slow.wait()
    deadline = time.time() + 15                   # its command dies with it (bootseer.node.proc)
    while any(os.path.exists(f"/proc/{c}") for c in children) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{c}") for c in children)
    r = bootseer("report", str(trace / "j"))
    assert r.returncode == 0, r.stderr
    assert "NOT READY: n1" in r.stdout
