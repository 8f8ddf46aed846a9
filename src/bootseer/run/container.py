"""Run a command with a directory (usually a lazy FUSE mount) as its container root.

``podman run --rootfs DIR:O`` is the first choice: the ``:O`` overlay gives the read-only
mount a writable upper layer, podman proxies signals, and a missing command exits 127.
This machine needs ``--runtime runc`` (crun fails), ``--network none`` (never podman's
bridge) and explicit ulimits (runc cannot raise RLIMIT_NOFILE without CAP_SYS_RESOURCE).
Podman's state lives under a short private path: it refuses a ``--runroot`` longer than
~50 characters. Without podman, ``unshare`` + an overlay + ``chroot`` does the same job.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bootseer.errors import BootseerError

log = logging.getLogger(__name__)
EXIT_NOT_FOUND = 127
_PODMAN_FLAGS = ["--runtime", "runc", "--network", "none", "--ulimit", "nofile=4096:4096",
                 "--ulimit", "nproc=4096:4096"]


class ContainerError(BootseerError):
    """The container could not be started (not: the command in it failed)."""


@dataclass(frozen=True, slots=True)
class Bind:
    source: str
    target: str
    readonly: bool = True


@dataclass(frozen=True, slots=True)
class Container:
    rootfs: str
    """Directory used as ``/`` (may be read-only: writes go to a private overlay)."""
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    binds: list[Bind] = field(default_factory=list)
    workdir: str = "/"


def available_runtimes() -> list[str]:
    found = []
    if shutil.which("podman") and shutil.which("runc"):
        found.append("podman")
    if shutil.which("unshare") and shutil.which("chroot"):
        found.append("chroot")
    return found


def _default_env() -> dict[str, str]:
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8"}


def _podman(state_dir: str) -> list[str]:
    """podman with this run's private storage: every container in it is ours."""
    return ["podman", "--root", f"{state_dir}/r", "--runroot", f"{state_dir}/rr",
            "--cgroup-manager", "cgroupfs", "--events-backend", "file"]


def podman_command(c: Container, state_dir: str) -> list[str]:
    """The podman argv. ``--rootfs`` takes no value: the path is the first positional,
    so every option must come before it."""
    cmd = [*_podman(state_dir), "run", "--rm", "--init", *_PODMAN_FLAGS, "--workdir", c.workdir]
    for b in c.binds:
        cmd += ["-v", f"{b.source}:{b.target}:{'ro' if b.readonly else 'rw'}"]
    for k, v in {**_default_env(), **c.env}.items():
        cmd += ["-e", f"{k}={v}"]
    return cmd + ["--rootfs", f"{c.rootfs}:O", *c.argv]


def chroot_command(c: Container, state_dir: str) -> list[str]:
    """``unshare`` into private mount and pid namespaces, stack a tmpfs overlay on the
    read-only root so bind targets can be created, bind, then ``chroot``."""
    merged, work = f"{state_dir}/m", f"{state_dir}/w"
    lines = ["set -e", f"mount -t tmpfs tmpfs {shlex.quote(work)}",
             f"mkdir -p {work}/upper {work}/work",
             f"mount -t overlay overlay -o lowerdir={shlex.quote(c.rootfs)},upperdir={work}/upper,"
             f"workdir={work}/work {shlex.quote(merged)}",
             f"mount -t proc proc {merged}/proc || true",
             f"mount --rbind /dev {merged}/dev || true"]
    for b in c.binds:
        target = shlex.quote(merged + b.target)
        kind = "mkdir -p" if os.path.isdir(b.source) else "touch"
        lines += [f"[ -e {target} ] || {{ mkdir -p $(dirname {target}); {kind} {target}; }}",
                  f"mount --bind {shlex.quote(b.source)} {target}"]
        if b.readonly:
            lines.append(f"mount -o remount,bind,ro {target}")
    env = [f"{k}={v}" for k, v in {**_default_env(), **c.env}.items()]
    inner = shlex.join(["env", "-i", *env, "sh", "-c", 'cd "$0" && exec "$@"', c.workdir,
                        *c.argv])
    lines.append(f"exec chroot {shlex.quote(merged)} {inner}")
    # --kill-child: if unshare itself is killed, the namespace's init gets SIGKILL.
    return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private",
            "sh", "-c", "\n".join(lines)]


class Running:
    """A started container: ``wait()`` returns the command's exit status (128+N when it was
    killed by signal N, 127 when the command does not exist in the image)."""

    def __init__(self, proc: subprocess.Popen, state_dir: str, runtime: str):
        self.proc, self.state_dir, self.runtime = proc, state_dir, runtime
        self.signalled: int | None = None   # the last signal forwarded
        self.orphaned = False               # podman left a container behind (removed)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is not None:
            return
        self.signalled = sig
        if self.runtime == "chroot":
            # unshare ignores SIGTERM/SIGINT while it waits: signal the namespace's init.
            for child in _children(self.proc.pid):
                try:
                    os.kill(child, sig)
                except ProcessLookupError:
                    pass
            return
        self.proc.send_signal(sig)

    def wait(self, timeout: float | None = None) -> int:
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is not None:
                self._cleanup()
        if self.orphaned and self.signalled:   # podman said 0, but the job was killed
            return 128 + self.signalled
        return 128 - rc if rc < 0 else rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.send_signal(signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self.runtime == "podman" and self.signalled and os.path.isdir(self.state_dir):
            # podman signalled while it was still creating the container exits (status 0)
            # and leaves the container running under conmon: remove every container of this
            # private root (they are all ours), killing what runs in them.
            try:
                rm = subprocess.run([*_podman(self.state_dir), "rm", "--force", "--all",
                                     "--time", "0"], capture_output=True, timeout=60)
                self.orphaned = bool(rm.stdout.strip())
            except subprocess.TimeoutExpired:
                log.warning("podman rm of the stopped job's container timed out")
        if self.runtime == "podman":
            # --rm removed the container; the private storage dirs may hold overlay mounts.
            unmount_under(self.state_dir)
        shutil.rmtree(self.state_dir, ignore_errors=True)


def unmount_under(path: str) -> None:
    """Lazily unmount every mount at or below ``path``, deepest first. (``umount -R`` on a
    directory that is not itself a mount point unmounts nothing: podman's storage leaves
    ``<root>/overlay`` bind-mounted on itself, and the directory could not be removed.)"""
    root = os.path.realpath(path)
    try:
        with open("/proc/self/mounts") as f:
            points = [line.split()[1].encode().decode("unicode_escape") for line in f]
    except OSError:
        return
    for mp in sorted((p for p in points if p == root or p.startswith(root + "/")),
                     key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], capture_output=True)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def start(c: Container, *, runtime: str = "auto", stdout=None, stderr=None) -> Running:
    """Start ``c`` and return at once. ``runtime``: ``auto``, ``podman`` or ``chroot``."""
    if not os.path.isdir(c.rootfs):
        raise ContainerError(f"container root {c.rootfs!r} is not a directory")
    if not c.argv:
        raise ContainerError("no command given to run in the container")
    have = available_runtimes()
    if runtime == "auto":
        if not have:
            raise ContainerError("no container runtime: install podman and runc "
                                 "(or util-linux for unshare + chroot)")
        runtime = have[0]
    elif runtime not in have:
        raise ContainerError(f"container runtime {runtime!r} is not available here "
                             f"(available: {', '.join(have) or 'none'})")
    # Short path on purpose: podman rejects a long --runroot.
    state_dir = tempfile.mkdtemp(prefix="bsr-", dir="/tmp")
    if runtime == "podman":
        argv = podman_command(c, state_dir)
    else:
        os.makedirs(f"{state_dir}/m")
        os.makedirs(f"{state_dir}/w")
        argv = chroot_command(c, state_dir)
    try:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, start_new_session=False)
    except OSError as e:
        shutil.rmtree(state_dir, ignore_errors=True)
        raise ContainerError(f"cannot start {runtime}: {e}") from e
    return Running(proc, state_dir, runtime)


def run(c: Container, *, runtime: str = "auto") -> int:
    """Run to completion, forwarding SIGINT/SIGTERM/SIGHUP to the container."""
    running = start(c, runtime=runtime)
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda n, _f: running.send_signal(n)) for s in forwarded}
    try:
        return running.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        running.kill()


def _exists_in_root(root: Path, path: str, depth: int = 0) -> bool:
    """Resolve ``path`` as if ``root`` were ``/``: absolute symlinks stay inside ``root``."""
    if depth > 40:
        return False
    current = root
    parts = [p for p in path.split("/") if p and p != "."]
    for i, part in enumerate(parts):
        nxt = current / part
        if nxt.is_symlink():
            target = os.readlink(nxt)
            rest = "/".join(parts[i + 1:])
            if target.startswith("/"):
                return _exists_in_root(root, f"{target}/{rest}", depth + 1)
            rel = os.path.relpath(current, root)
            return _exists_in_root(root, f"/{rel}/{target}/{rest}", depth + 1)
        if not nxt.exists():
            return False
        current = nxt
    return True


def rootfs_has(rootfs: str | Path, argv0: str,
               path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") -> bool:
    """Whether ``argv0`` resolves inside ``rootfs``: checked before starting, so a command
    missing from the image is a clear error with exit status 127."""
    root = Path(rootfs)
    if "/" in argv0:
        return _exists_in_root(root, argv0)
    return any(_exists_in_root(root, f"{d}/{argv0}") for d in path.split(":"))
