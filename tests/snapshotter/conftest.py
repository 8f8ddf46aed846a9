"""A real containerd (Debian's 1.6) with its own config, root and socket, and the bootseer
snapshotter as its proxy plugin, both started per test and stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import is_root, need


def wait_socket(path: str, proc: subprocess.Popen, log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args[0]} did not listen on {path}:\n{log.read_text()}")
        time.sleep(0.05)


class Snapshotter:
    """``bootseer snapshotter serve`` as a subprocess (restartable, killable)."""

    def __init__(self, base: Path, root: Path):
        self.sock = str(base / "s.sock")
        self.root = root
        self.log = base / "snapshotter.log"
        self.proc = None

    def start(self) -> "Snapshotter":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bootseer", "-v", "snapshotter", "serve",
             "--address", self.sock, "--root", str(self.root)],
            stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        wait_socket(self.sock, self.proc, self.log)
        return self

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)


class Containerd:
    def __init__(self, base: Path, snapshotter: Snapshotter):
        self.base = base
        self.sock = str(base / "c.sock")
        self.snapshotter = snapshotter
        (base / "config.toml").write_text(f"""version = 2
root = "{base}/root"
state = "{base}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{self.sock}"
[proxy_plugins]
  [proxy_plugins.bootseer]
    type = "snapshot"
    address = "{snapshotter.sock}"
""")
        self.log = base / "containerd.log"
        self.proc = subprocess.Popen(["containerd", "--config", str(base / "config.toml")],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        wait_socket(self.sock, self.proc, self.log)

    def ctr(self, *args, check=True, timeout=120) -> subprocess.CompletedProcess:
        r = subprocess.run(["ctr", "--address", self.sock, *args], capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} failed ({r.returncode}): "
                                 f"{r.stderr.strip()}\n-- snapshotter log:\n"
                                 f"{self.snapshotter.log.read_text()[-3000:]}")
        return r

    def stop(self) -> None:
        # Tasks first (their shims are containerd's children in another process group).
        r = subprocess.run(["ctr", "--address", self.sock, "tasks", "ls", "-q"],
                           capture_output=True, text=True)
        for task in r.stdout.split():
            subprocess.run(["ctr", "--address", self.sock, "tasks", "kill", "-s", "KILL", task],
                           capture_output=True)
            subprocess.run(["ctr", "--address", self.sock, "tasks", "rm", "-f", task],
                           capture_output=True)
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def unmount_below(path: Path) -> None:
    """Unmount whatever is still mounted below ``path``, deepest first."""
    prefix = str(path) + "/"
    with open("/proc/self/mounts") as f:
        targets = [line.split()[1] for line in f if line.split()[1].startswith(prefix)]
    for t in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", t], capture_output=True)


@pytest.fixture
def containerd(tmp_path):
    need(is_root(), "containerd needs root")
    need(shutil.which("containerd") is not None and shutil.which("ctr") is not None,
         "containerd is not installed (apt-get install containerd)")
    base = Path(f"/tmp/bsc-{tmp_path.name[-8:]}")   # unix socket paths must stay short
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    snap = Snapshotter(base, base / "snap").start()
    ctd = None
    try:
        ctd = Containerd(base, snap)
        yield ctd
    finally:
        if ctd:
            ctd.stop()
        snap.stop()
        unmount_below(base)
        shutil.rmtree(base, ignore_errors=True)
