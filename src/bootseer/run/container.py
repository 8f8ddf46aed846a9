"""Run a command with a directory (usually a lazy FUSE mount) as its container root.

``podman run --rootfs DIR:O`` is the first choice: the ``:O`` overlay gives the read-only
mount a writable upper layer, podman proxies signals, and a missing command exits 127.
This machine needs ``--runtime runc`` (crun fails). Podman's state lives under a short
private path: it refuses a ``--runroot`` longer than ~50 characters. Without podman,
``unshare`` + an overlay + ``chroot`` does the same job, with its own ``/dev`` (a tmpfs
with the usual nodes, a private devpts and a ``/dev/shm``; never the host's ``/dev``).
A user without root gets the ``rootless`` runtime: the same in a user namespace
(:mod:`bootseer.run.rootless`).

The container is fit for training (:class:`Options`): the node's network (torchrun, c10d
and NCCL expect it), the host's IPC namespace or a sized ``/dev/shm``, the host's hard
``nofile`` limit, unlimited ``memlock`` (RDMA), and the GPU/InfiniBand devices planned by
:mod:`bootseer.run.devices`.
"""

from __future__ import annotations

import logging
import os
import resource
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.node import proc as procs
from bootseer.node.mounts import unmount_under
from bootseer.run import inroot, rootless
from bootseer.run.devices import DevicePlan
from bootseer.run.devices import plan as devices_plan

log = logging.getLogger(__name__)
EXIT_NOT_FOUND = 127
PODMAN_NETWORK_MODES = ("host", "none", "private", "bridge", "slirp4netns", "pasta")
CHROOT_NETWORK_MODES = ("host", "none")
# The nodes every container's /dev has (name, major, minor): chroot makes them itself.
STANDARD_DEV_NODES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8),
                      ("urandom", 1, 9), ("tty", 5, 0))


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
    options: Options = field(default_factory=lambda: Options())


@dataclass(frozen=True, slots=True)
class Options:
    """What makes the container fit for a training job (defaults: a node of a job)."""
    network: str = "host"
    """``host`` (the node's network), ``none``, ``ns:PATH`` (a network namespace), or any
    other podman network mode or network name (podman runtime)."""
    shm_size: int | None = None
    """Bytes of a private ``/dev/shm``; None: the host's IPC namespace (podman ``--ipc
    host``; the chroot runtime always shares it and mounts an unsized /dev/shm tmpfs)."""
    devices: DevicePlan = field(default_factory=DevicePlan)
    """GPU and InfiniBand devices (:func:`bootseer.run.devices.plan`)."""


def check_network(network: str, runtime: str) -> None:
    """Refuse a network mode the runtime cannot set up, before anything is mounted."""
    mode = network.split(":", 1)[0]
    if runtime == "rootless":
        if network not in rootless.NETWORK_MODES:
            raise ContainerError(f"--network {network}: without root, host and none are "
                                 f"supported")
        return
    if mode == "ns":
        path = network[3:]
        if not path or not os.path.exists(path):
            raise ContainerError(f"--network {network}: no network namespace at {path!r}")
        return
    if runtime == "chroot":
        if network not in CHROOT_NETWORK_MODES:
            raise ContainerError(f"--network {network}: the chroot runtime supports host, "
                                 f"none and ns:PATH (podman supports more)")
        return
    if mode in PODMAN_NETWORK_MODES or mode == "container":
        if mode in ("slirp4netns", "pasta") and not shutil.which(mode):
            raise ContainerError(f"--network {network}: {mode} is not installed")
        return
    try:   # a network name: podman knows it or refuses it
        known = subprocess.run(["podman", "network", "exists", network],
                               capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        known = False
    if not known:
        raise ContainerError(f"--network {network}: podman has no such network or mode "
                             f"(use host, none, private, bridge, ns:PATH or a name from "
                             f"'podman network ls')")


def host_hard_limit(which: int, cap: int | None = None) -> int:
    """The host's hard limit (-1: unlimited), at most ``cap``."""
    hard = resource.getrlimit(which)[1]
    if hard == resource.RLIM_INFINITY:
        return -1 if cap is None else cap
    return hard if cap is None else min(hard, cap)


def _limit_word(value: int, unit: int = 1) -> str:
    """For the shell's ``ulimit`` (``-l`` counts KiB)."""
    return "unlimited" if value < 0 else str(value // unit)


def _proc_int(path: str, default: int) -> int:
    try:
        return int(Path(path).read_text())
    except (OSError, ValueError):
        return default


def _nofile_limit() -> int:
    return host_hard_limit(resource.RLIMIT_NOFILE, _proc_int("/proc/sys/fs/nr_open", 1048576))


def podman_option_flags(o: Options) -> list[str]:
    # The host's hard limits, soft raised to them: a limit above the hard one needs
    # CAP_SYS_RESOURCE, which a node's bootseer may lack. memlock is unlimited where the
    # node allows it (RDMA registers memory; see docs/gpu.md).
    # nproc: at most pid_max (podman lowers its own limit to it; more cannot be used).
    nofile = _nofile_limit()
    nproc = host_hard_limit(resource.RLIMIT_NPROC, _proc_int("/proc/sys/kernel/pid_max", 32768))
    memlock = host_hard_limit(resource.RLIMIT_MEMLOCK)
    flags = ["--runtime", "runc", "--network", o.network,
             "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"memlock={memlock}:{memlock}",
             "--ulimit", f"nproc={nproc}:{nproc}"]
    flags += ["--shm-size", str(o.shm_size)] if o.shm_size else ["--ipc", "host"]
    d = o.devices
    for name in d.cdi:
        flags += ["--device", name]
    for node in d.nodes:
        flags += ["--device", f"{node.host}:{node.target}"]
    if d.hooks_dir:
        flags += ["--hooks-dir", d.hooks_dir]
    return flags


def available_runtimes() -> list[str]:
    if os.geteuid() != 0:   # rootful podman and mount(2) need root; a user namespace not
        return [] if rootless.unavailable() else ["rootless"]
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
    cmd = [*_podman(state_dir), "run", "--rm", "--init", *podman_option_flags(c.options),
           "--workdir", c.workdir]
    for b in c.binds:
        cmd += ["-v", f"{b.source}:{b.target}:{'ro' if b.readonly else 'rw'}"]
    for k, v in {**_default_env(), **c.options.devices.env, **c.env}.items():
        cmd += ["-e", f"{k}={v}"]
    return cmd + ["--rootfs", f"{c.rootfs}:O", *c.argv]


def _dev_lines(dev: str, o: Options) -> list[str]:
    """A private /dev: a tmpfs (device nodes allowed, never set-id or executables) with the
    standard nodes, a new devpts instance for ptys, a /dev/shm, and the planned GPU and
    InfiniBand nodes made with the host's major/minor. The host's /dev is never bound in:
    a process in the container can neither remove the host's nodes nor open its disks."""
    q = shlex.quote(dev)
    shm = f",size={o.shm_size}" if o.shm_size else ""
    lines = [f"mkdir -p {q}", f"mount -t tmpfs -o nosuid,noexec,mode=755,size=1m bootseer-dev {q}"]
    lines += [f"mknod -m 666 {q}/{name} c {major} {minor}"
              for name, major, minor in STANDARD_DEV_NODES]
    lines += rootless.dev_rest(q, shm)
    for node in o.devices.nodes:
        try:
            st = os.stat(node.host)
        except OSError as e:
            raise ContainerError(f"device {node.host} vanished: {e}") from e
        target = shlex.quote(dev + node.target.removeprefix("/dev"))
        lines += [f"t={target}", 'mkdir -p "${t%/*}"',
                  f"mknod -m {st.st_mode & 0o777:o} {target} c {os.major(st.st_rdev)} "
                  f"{os.minor(st.st_rdev)}"]
    return lines


def _host_name_files(o: Options) -> list[Bind]:
    """On the node's network the container resolves names as the node does."""
    if o.network != "host":
        return []
    return [Bind(p, p) for p in ("/etc/hosts", "/etc/resolv.conf") if os.path.isfile(p)]


def chroot_command(c: Container, state_dir: str) -> list[str]:
    """``unshare`` into private mount and pid namespaces, stack a tmpfs overlay on the
    read-only root so bind targets can be created, give it its own /dev, bind, then
    ``chroot``."""
    merged, work = f"{state_dir}/m", f"{state_dir}/w"
    o = c.options
    lines = ["set -e", f"mount -t tmpfs tmpfs {shlex.quote(work)}",
             f"mkdir -p {work}/upper {work}/work",
             f"mount -t overlay overlay -o lowerdir={shlex.quote(c.rootfs)},upperdir={work}/upper,"
             f"workdir={work}/work {shlex.quote(merged)}",
             f"mkdir -p {merged}/proc {merged}/sys",
             f"mount -t proc proc {merged}/proc || true",
             f"mount -t sysfs -o ro,nosuid,nodev,noexec sysfs {merged}/sys || true",
             *_dev_lines(f"{merged}/dev", o)]
    for b in [*_host_name_files(o), *c.binds]:
        # the shell's own expansion and redirection, not dirname and touch: each program
        # the script runs is a fork and an exec on the path to the job's start
        make = 'mkdir -p "$t"' if os.path.isdir(b.source) else ': > "$t"'
        lines += [f"t={shlex.quote(merged + b.target)}",
                  f'[ -e "$t" ] || {{ mkdir -p "${{t%/*}}"; {make}; }}',
                  f'mount --bind {shlex.quote(b.source)} "$t"']
        if b.readonly:
            lines.append('mount -o remount,bind,ro "$t"')
    lines += _limit_lines()
    lines.append(f"exec chroot {shlex.quote(merged)} {shlex.join(_inner(c))}")
    namespaces = ["--mount", "--pid"] + (["--net"] if o.network == "none" else [])
    enter = ["nsenter", f"--net={o.network[3:]}"] if o.network.startswith("ns:") else []
    # --kill-child: if unshare itself is killed, the namespace's init gets SIGKILL.
    return [*enter, "unshare", *namespaces, "--fork", "--kill-child", "--propagation",
            "private", "sh", "-c", "\n".join(lines)]


def _limit_lines() -> list[str]:
    return [f"ulimit -n {_nofile_limit()} 2>/dev/null || true",
            f"ulimit -l {_limit_word(host_hard_limit(resource.RLIMIT_MEMLOCK), 1024)} "
            f"2>/dev/null || true"]


def _inner(c: Container) -> list[str]:
    """The command as run in the root: a clean environment, cd to the workdir, exec."""
    env = [f"{k}={v}" for k, v in {**_default_env(), **c.options.devices.env, **c.env}.items()]
    return ["env", "-i", *env, "sh", "-c", 'cd "$0" && exec "$@"', c.workdir, *c.argv]


def rootless_command(c: Container, state_dir: str) -> list[str]:
    """The argv of the ``rootless`` runtime (:func:`bootseer.run.rootless.command`)."""
    binds = [(b.source, b.target, b.readonly) for b in [*_host_name_files(c.options), *c.binds]]
    nodes = [(n.host, n.target) for n in c.options.devices.nodes]
    return rootless.command(c.rootfs, state_dir, _inner(c), binds=binds, nodes=nodes,
                            network=c.options.network, shm_size=c.options.shm_size,
                            limits=_limit_lines())


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
        if self.runtime in ("chroot", "rootless"):
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


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def pick_runtime(runtime: str = "auto") -> str:
    """``auto`` -> the first available runtime; refuse one that is not installed."""
    have = available_runtimes()
    if not have and os.geteuid() != 0:
        raise ContainerError(f"cannot enter an image without root: {rootless.unavailable()}")
    if runtime == "auto":
        if not have:
            raise ContainerError("no container runtime: install podman and runc "
                                 "(or util-linux for unshare + chroot)")
        return have[0]
    if runtime not in have:
        raise ContainerError(f"container runtime {runtime!r} is not available here "
                             f"(available: {', '.join(have) or 'none'})")
    return runtime


def start(c: Container, *, runtime: str = "auto", stdout=None, stderr=None,
          on_state: Callable[[str, list[str] | None], None] | None = None) -> Running:
    """Start ``c`` and return at once. ``runtime``: ``auto``, ``podman``, ``chroot`` or
    ``rootless``.
    ``on_state(state_dir, undo)``: called before anything runs with the private state
    directory and the command that removes its containers (None: nothing to remove), so a
    caller can have them cleaned if it is killed."""
    if not os.path.isdir(c.rootfs):
        raise ContainerError(f"container root {c.rootfs!r} is not a directory")
    if not c.argv:
        raise ContainerError("no command given to run in the container")
    runtime = pick_runtime(runtime)
    check_network(c.options.network, runtime)
    # Short path on purpose: podman rejects a long --runroot.
    state_dir = tempfile.mkdtemp(prefix="bsr-", dir="/tmp")
    if runtime == "podman":
        argv = podman_command(c, state_dir)
    else:
        os.makedirs(f"{state_dir}/m")
        os.makedirs(f"{state_dir}/w")
        argv = (rootless_command if runtime == "rootless" else chroot_command)(c, state_dir)
    if on_state is not None:
        on_state(state_dir, [*_podman(state_dir), "rm", "--force", "--all", "--time", "0"]
                 if runtime == "podman" else None)
    try:
        # Dies with us: podman forwards SIGTERM to the job; unshare --kill-child needs SIGKILL.
        proc = procs.spawn(subprocess.Popen, argv, stdout=stdout, stderr=stderr,
                           preexec_fn=procs.preexec(signal.SIGTERM if runtime == "podman"
                                                    else signal.SIGKILL))
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


def rootfs_has(rootfs: str | Path, argv0: str, path: str = inroot.DEFAULT_PATH) -> bool:
    """Whether ``argv0`` resolves inside ``rootfs`` as in the container (bootseer.run.inroot:
    never through ``..`` or a link onto the host): checked before starting, so a command
    missing from the image is a clear error with exit status 127."""
    return inroot.has_command(rootfs, argv0, path)


def training_options(runtime: str = "auto", *, network: str = "host", gpus: str = "auto",
                     shm_size: int | None = None, root: str = "/") -> tuple[str, Options]:
    """Pick the runtime and check everything the container needs (network mode, GPUs),
    before anything is mounted: (runtime, options). Raises ContainerError/DeviceError."""
    runtime = pick_runtime(runtime)
    check_network(network, runtime)
    plan = devices_plan(gpus, runtime=runtime, root=root)
    if plan.nodes or plan.cdi:
        log.info("devices for the container: %s", plan.describe())
    return runtime, Options(network=network, shm_size=shm_size, devices=plan)
