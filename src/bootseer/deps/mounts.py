"""Mounted environments: making, naming and undoing them. What is mounted is decided by
``restore`` (a kernel mount of a snapshot's blob) and ``ensure`` (``--mount``, a lazy
one); how a tree is served is the serving seam's (``bootseer.mount``).

- A kernel mount: EROFS on the blob at the prefix, from the tree's metadata image; by
  default under an overlay (EROFS its lower layer, upper and work directories in the
  mount's state directory), so a job that writes into its environment behaves as it does
  in an extracted one; its writes are dropped at ``deps umount``, the blob is never
  written. The sidecar is written before the mount and completed (the mount id) after it.
- A lazy mount: the snapshot's tree served at the prefix by a FUSE server that outlives
  the command (``python -m bootseer.deps.mountd``, in its own session): the lazy image's
  machinery (``bootseer.tree.session``), so the start's reads are recorded, the tree's
  hot-block profile is published when the window closes, and the next node's mount
  prefetches it.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from bootseer import trace as tracing
from bootseer.config import BootseerConfig
from bootseer.deps import relocate
from bootseer.deps.prefix import (
    KERNEL_BACKEND,
    is_kernel,
    mounted_info,
    rmtree,
    sidecar,
    sidecar_info,
    state_dir,
    write_json,
)
from bootseer.deps.resolve import DepsError
from bootseer.errors import MountError
from bootseer.mount.serve import serve_image
from bootseer.node import mounts
from bootseer.node.proc import pid_alive

log = logging.getLogger(__name__)


class KernelMountError(MountError):
    """An environment cannot be (or is not) the kernel mount bootseer made."""


# -- kernel mounts ----------------------------------------------------------------------------
def mount_kernel(prefix: str, key: str, tree: str, meta: str, blob: str, *, writable: bool,
                 relocated: dict | None = None, server: int | None = None) -> None:
    """Mount at ``prefix`` (made empty by the caller); the sidecar first, so that a
    command killed mid-way leaves a mount recognised as ours. ``relocated`` (a snapshot
    made at another prefix: ``{"from", "text", "links", ...}``): its recorded
    occurrences are rewritten through the overlay, into its upper directory, before the
    mount is complete. ``server``: the pid of the server of a blob still being filled
    (``fillsrv``; EROFS then reads it with O_DIRECT), stopped with the mount. A failure
    unmounts what it mounted."""
    state = state_dir(prefix)
    sweep(prefix, images=False)    # a dead mount's leftovers, not the image just written
    os.makedirs(prefix, exist_ok=True)
    info = {"key": key, "tree": tree, "backend": KERNEL_BACKEND, "writable": writable,
            "blob": blob, "meta": meta, "mount_id": None, "started": time.time(),
            "relocated": relocated, "server_pid": server}
    write_json(Path(sidecar(prefix)), info)
    try:
        with tracing.phase("deps.mount", writable=writable):
            serve_image(meta, blob, prefix, overlay_in=state if writable else None,
                        directio=server is not None)
        if relocated:
            with tracing.phase("deps.relocate") as span:
                span.set(paths=relocate.rewrite(prefix, relocated, relocated["from"], prefix))
    except BaseException:
        _unmount_kernel(prefix, info)
        raise
    entry = mounts.find(prefix)
    info["mount_id"] = entry.mount_id if entry is not None else None
    write_json(Path(sidecar(prefix)), info)
    log.info("%s: EROFS on the local blob at %s%s", key[:19], prefix,
             " under a writable overlay" if writable else " (read-only)")


def _unmount_kernel(prefix: str, info: dict | None = None) -> bool:
    """Unmount the environment at ``prefix`` (the overlay, then EROFS beneath it), lazily
    where files are held open (the kernel keeps the filesystems for the open files and
    frees them at the last close); then remove the sidecar and the state it used (the
    overlay's upper and work directories). Returns whether the unmount was immediate.
    A mount at ``prefix`` that is not the one the sidecar names is left alone (error)."""
    immediate = True
    entry = mounts.find(prefix) if mounts.is_mount_point(prefix) else None
    if entry is not None:
        recorded = (info or {}).get("mount_id")
        # no id yet: a command killed between mount(2) and completing the sidecar
        if entry.mount_id != recorded and (recorded is not None or
                                           entry.fstype not in ("erofs", "overlay")):
            raise KernelMountError(f"the mount at {prefix} is not the environment bootseer "
                                   f"mounted there ({entry.fstype}): not unmounting it")
        immediate = mounts.unmount(prefix)
    sweep(prefix)
    server = (info or {}).get("server_pid")
    if server:   # a lazy restore's: its blob server, then what it kept in the state
        _stop_server(server)
        for name in ("fill-record.json", "fill.json", "server.log"):
            Path(state_dir(prefix), name).unlink(missing_ok=True)
        sweep(prefix)
    Path(sidecar(prefix)).unlink(missing_ok=True)
    if not immediate:
        log.info("%s is in use: detached lazily (freed when the last file closes)", prefix)
    return immediate


def _stop_server(pid: int | None, timeout_s: float = 20.0) -> None:
    """Stop a filling blob's server (it unmounts the blob and ends; an incomplete fill
    leaves no blob)."""
    if not pid or not pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """Alive and not a zombie (the server's parent, the ensure that started it, may live
    on without reaping it: a job's launcher calling ``ensure``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return pid_alive(pid) and f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def sweep(prefix: str, *, images: bool = True) -> None:
    """Remove what a kernel mount of ``prefix`` kept in its state directory: the EROFS
    lower layer (detached lazily if still in use), the overlay's directories, and (with
    ``images``) a metadata image written there (a node cache on tmpfs cannot hold it)."""
    state = state_dir(prefix)
    lower = os.path.join(state, "lower")
    if mounts.is_mount_point(lower):
        mounts.unmount(lower)
    for d in ("upper", "work"):
        rmtree(os.path.join(state, d))
    for image in Path(state).glob("*.meta*") if images else ():
        image.unlink(missing_ok=True)   # the kernel holds a mounted one open
    for d in (lower, state):
        try:
            os.rmdir(d)
        except OSError:
            pass   # absent, or holds what a lazy mount (--mount) keeps there


# -- lazy mounts ------------------------------------------------------------------------------
def mount_env(config: BootseerConfig, tree: str, prefix: str, key: str, *,
              window_s: float = 120.0, timeout_s: float = 120.0) -> dict:
    """Start the lazy mount's server and return once the environment is visible at
    ``prefix``."""
    if mounts.is_mount_point(prefix):
        raise DepsError(f"{prefix} is already a mount point")
    os.makedirs(prefix, exist_ok=True)
    state = state_dir(prefix)
    os.makedirs(state, exist_ok=True)
    pid = start_server("bootseer.deps.mountd", [prefix, tree, key, state, str(window_s)],
                       config, state, f"cannot mount the environment at {prefix}",
                       timeout_s=timeout_s)
    return mounted_info(prefix) or {"key": key, "tree": tree, "pid": pid}


def start_server(module: str, args: list[str], payload, state: str, what: str, *,
                 timeout_s: float = 120.0) -> int:
    """Start ``python -m module *args`` in its own session (it outlives the command),
    ``payload`` pickled on its stdin, its log in ``state/server.log``; return its pid once
    it prints ``ready``. Raises DepsError (``what``: the one-line reason's start) with its
    ``error: ...`` line or its log's tail."""
    log_path = os.path.join(state, "server.log")
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log_file, start_new_session=True, close_fds=True)
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None and stdout is not None   # both PIPEs
    stdin.write(pickle.dumps(payload))
    stdin.close()
    line = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stdout], [], [], 0.1)
        if ready:
            line = stdout.readline()
            break
        if proc.poll() is not None:
            break
    stdout.close()
    if line.strip() != b"ready":
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        tail = " | ".join(open(log_path, errors="replace").read().strip().splitlines()[-4:])
        raise DepsError(f"{what}: "
                        f"{line.decode(errors='replace').strip() or tail or 'server died'}")
    return proc.pid


# -- either kind ------------------------------------------------------------------------------
def unmount(prefix: str, timeout_s: float = 20.0) -> bool:
    """Stop the mount at ``prefix``: a lazy one's server unmounts on SIGTERM; a kernel
    restore is unmounted here (lazily while files are open). False if none."""
    recorded = sidecar_info(prefix)
    if is_kernel(recorded):
        live = mounts.is_mount_point(prefix)
        _unmount_kernel(prefix, recorded)   # or its state, if a dead command left it
        return live
    info = mounted_info(prefix)
    if info is None:
        if mounts.is_mount_point(prefix) and os.path.exists(sidecar(prefix)):   # server died
            mounts.lazy_unmount(prefix)
        return False
    pid = int(info["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while (pid_alive(pid) or mounts.is_mount_point(prefix)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    if mounts.is_mount_point(prefix):
        mounts.lazy_unmount(prefix)
    Path(sidecar(prefix)).unlink(missing_ok=True)
    return True
