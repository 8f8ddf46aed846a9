"""A real containerd (Debian's 1.6) with its own config, root and sockets, and the bootseer
snapshotter as its proxy plugin, each started as a subprocess and stopped by PID: one
"node" for the snapshotter's tests and bench/image. ``netns``: run both inside that
network namespace (the benchmark's shaped link)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bootseer.snapshotter.holder import release_all


def wait_socket(path: str, proc: subprocess.Popen[bytes], log: Path,
                timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            what = proc.args[0] if isinstance(proc.args, list) else proc.args
            raise RuntimeError(f"{what!s} did not listen on {path}:\n{log.read_text()}")
        time.sleep(0.05)


def _ns(netns: str | None) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{netns}"] if netns else []


class Snapshotter:
    """``bootseer snapshotter serve`` as a subprocess (restartable, killable)."""

    def __init__(self, base: Path, root: Path, *, args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, netns: str | None = None):
        self.sock = str(base / "s.sock")
        self.root = root
        self.log = base / "snapshotter.log"
        self.args, self.env, self.netns = list(args), env, netns
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Snapshotter:
        proc = self.proc = subprocess.Popen(
            [*_ns(self.netns), sys.executable, "-m", "bootseer", "-v", "snapshotter", "serve",
             "--address", self.sock, "--root", str(self.root), *self.args],
            stdout=open(self.log, "a"), stderr=subprocess.STDOUT,
            env={**os.environ, **(self.env or {})})
        wait_socket(self.sock, proc, self.log)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise


def cri_config(base: Path, sandbox_image: str, registry: str,
               snapshotter: str = "bootseer") -> str:
    """The CRI plugin as a Kubernetes node configures it for a proxy snapshotter: the
    snapshotter by default and its annotations on (``disable_snapshot_annotations``)."""
    return f"""[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # a sandbox (this machine, a node in a container) may not lower oom_score_adj to -998
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter}"
    disable_snapshot_annotations = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{base}/cni/bin"
    conf_dir = "{base}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{registry}"]
    endpoint = ["http://{registry}"]
"""


class Containerd:
    def __init__(self, base: Path, snapshotter: Snapshotter, cri: str | None = None,
                 netns: str | None = None):
        self.base = base
        self.sock = str(base / "c.sock")
        self.snapshotter = snapshotter
        top = "" if cri else 'disabled_plugins = ["io.containerd.grpc.v1.cri"]'
        (base / "config.toml").write_text(f"""version = 2
root = "{base}/root"
state = "{base}/state"
{top}
[grpc]
  address = "{self.sock}"
[proxy_plugins]
  [proxy_plugins.bootseer]
    type = "snapshot"
    address = "{snapshotter.sock}"
{cri or ""}""")
        self.log = base / "containerd.log"
        self.proc = subprocess.Popen([*_ns(netns), "containerd", "--config",
                                      str(base / "config.toml")],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        wait_socket(self.sock, self.proc, self.log)

    def ctr(self, *args: str, check: bool = True, timeout: float = 120,
            namespace: str = "default") -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["ctr", "--address", self.sock, "-n", namespace, *args],
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} failed ({r.returncode}): "
                                 f"{r.stderr.strip()}\n-- snapshotter log:\n"
                                 f"{self.snapshotter.log.read_text()[-3000:]}")
        return r

    def stop(self) -> None:
        # Tasks first (their shims are containerd's children in another process group).
        for ns in ("default", "k8s.io"):
            c = ["ctr", "--address", self.sock, "-n", ns]
            r = subprocess.run([*c, "tasks", "ls", "-q"], capture_output=True, text=True)
            for task in r.stdout.split():
                subprocess.run([*c, "tasks", "kill", "-s", "KILL", task], capture_output=True)
                subprocess.run([*c, "tasks", "rm", "-f", task], capture_output=True)
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


class Node:
    """One node: a snapshotter (with its own root and node cache) under a containerd.
    ``cri``: (sandbox image, plain-http registry host[, the CRI's snapshotter])."""

    def __init__(self, base: Path, *, snapshotter_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, cri: tuple[str, ...] | None = None,
                 netns: str | None = None):
        base.mkdir(parents=True)
        self.base = base
        self.snapshotter = Snapshotter(base, base / "snap", args=snapshotter_args, env=env,
                                       netns=netns)
        self.snapshotter.start()
        self.containerd = None
        try:
            self.containerd = Containerd(base, self.snapshotter,
                                         cri_config(base, *cri) if cri else None, netns)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        try:
            if self.containerd:
                self.containerd.stop()
        finally:
            try:
                self.snapshotter.stop()
            finally:
                release_all(str(self.snapshotter.root))   # the trees' holders, by PID
                unmount_below(self.base)
                shutil.rmtree(self.base, ignore_errors=True)


def push_pause(netns: str | None, registry_host: str, scratch: Path) -> str:
    """A pod sandbox image (busybox-static sleeping: the CRI stops it with a signal),
    pushed to the plain-http registry at ``registry_host``; ``scratch`` holds its rootfs."""
    ref = f"{registry_host}/test/pause:1"
    root = scratch / "pause-rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", root / "bin/busybox")
    (root / "bin/sleep").symlink_to("busybox")
    state = f"/tmp/bsbp-{os.getpid()}"
    b = ["buildah", "--root", f"{state}/r", "--runroot", f"{state}/rr", "--storage-driver", "vfs"]
    ns = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
    try:
        c = subprocess.run([*b, "from", "scratch"], capture_output=True, text=True,
                           check=True).stdout.strip()
        subprocess.run([*b, "copy", c, f"{root}/", "/"], check=True, capture_output=True)
        subprocess.run([*b, "config", "--cmd", '["/bin/sleep", "86400"]', c], check=True,
                       capture_output=True)
        subprocess.run([*b, "commit", "-q", c, "pause"], check=True, capture_output=True)
        subprocess.run([*ns, *b, "push", "-q", "--tls-verify=false", "pause", f"docker://{ref}"],
                       check=True, capture_output=True)
    finally:
        subprocess.run(["umount", "-R", "-l", f"{state}/r"], capture_output=True)
        shutil.rmtree(state, ignore_errors=True)
    return ref
