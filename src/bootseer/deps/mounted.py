"""Mounted environments. A restore on a kernel with file-backed EROFS is a kernel mount
(``kernel_restore``); this module names both kinds and unmounts them.

Lazy environments (``deps ensure --mount``): the snapshot's tree served read-only at
the prefix by a FUSE server that outlives the command, so a job starts importing before
the environment is local; what it reads is fetched on demand, verified, and cached.

The server (``python -m bootseer.deps.mountd``) runs in its own session. It is the lazy
image's machinery (``bootseer.tree.session``): the start's reads are recorded, the tree's
hot-block profile is published when the window closes, and the next node's mount
prefetches it.
Its state sits next to the prefix: ``<prefix>.mount.json`` (key, tree, server pid) names
a live mount; ``<prefix>.mount-state/`` holds the recording and the server's log (and,
for a kernel restore, the overlay's directories).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import time

from bootseer.config import BootseerConfig
from bootseer.deps.resolve import DepsError
from bootseer.node.proc import pid_alive


def sidecar(prefix: str) -> str:
    return f"{prefix}.mount.json"


def state_dir(prefix: str) -> str:
    return f"{prefix}.mount-state"


def is_mount_point(path: str) -> bool:
    """Whether ``path`` is a mount point, read from the mount table: a FUSE mount whose
    server died fails every stat (ENOTCONN), which ``os.path.ismount`` takes for "no"."""
    path = os.path.abspath(path)   # the table has real paths; the last part is never resolved
    path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4]
                if "\\" in point:   # spaces and the like are octal escapes
                    point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point)
                if point == path:
                    return True
    except OSError:
        return os.path.ismount(path)
    return False


def _sidecar_info(prefix: str) -> dict | None:
    try:
        info = json.loads(open(sidecar(prefix)).read())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


KERNEL_BACKEND = "erofs"      # the sidecar's "backend" of a kernel restore (no server)


def is_kernel(info: dict | None) -> bool:
    """Whether the sidecar names a kernel mount (a restore: EROFS, no server)."""
    return bool(info) and info.get("backend") == KERNEL_BACKEND


def kernel_mount_live(prefix: str, info: dict) -> bool:
    """Whether the kernel mount the sidecar ``info`` names is the one at ``prefix`` (the
    topmost mount there has the mount id recorded when it was made)."""
    from bootseer.node import mounts as points
    entry = points.find(prefix)
    return entry is not None and info.get("mount_id") is not None and \
        entry.mount_id == info["mount_id"]


def mounted_info(prefix: str) -> dict | None:
    """The live mount at ``prefix``: a lazy one (``{"key", "tree", "pid"}``) or a kernel
    restore (``{"key", "tree", "backend": "erofs", "blob", "mount_id", ...}``), or None."""
    info = _sidecar_info(prefix)
    if info is None:
        return None
    if is_kernel(info):
        return info if kernel_mount_live(prefix, info) else None
    if is_mount_point(prefix) and pid_alive(int(info.get("pid", 0))):
        return info
    return None


def mount_env(config: BootseerConfig, tree: str, prefix: str, key: str, *,
              window_s: float = 120.0, timeout_s: float = 120.0) -> dict:
    """Start the server and return once the environment is visible at ``prefix``."""
    if is_mount_point(prefix):
        raise DepsError(f"{prefix} is already a mount point")
    os.makedirs(prefix, exist_ok=True)
    state = state_dir(prefix)
    os.makedirs(state, exist_ok=True)
    log_path = os.path.join(state, "server.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bootseer.deps.mountd", prefix, tree, key, state,
             str(window_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            start_new_session=True, close_fds=True)
    proc.stdin.write(pickle.dumps(config))
    proc.stdin.close()
    line = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            break
        if proc.poll() is not None:
            break
    proc.stdout.close()
    if line.strip() != b"ready":
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        tail = " | ".join(open(log_path, errors="replace").read().strip().splitlines()[-4:])
        raise DepsError(f"cannot mount the environment at {prefix}: "
                        f"{line.decode(errors='replace').strip() or tail or 'server died'}")
    return mounted_info(prefix) or {"key": key, "tree": tree, "pid": proc.pid}


def unmount(prefix: str, timeout_s: float = 20.0) -> bool:
    """Stop the mount at ``prefix``: a lazy one's server unmounts on SIGTERM; a kernel
    restore is unmounted here (lazily while files are open). False if none."""
    recorded = _sidecar_info(prefix)
    if is_kernel(recorded):
        from bootseer.deps.kernel_restore import unmount as kernel_unmount
        if not is_mount_point(prefix):
            kernel_unmount(prefix, recorded)   # its state, if a dead command left it
            return False
        kernel_unmount(prefix, recorded)
        return True
    info = mounted_info(prefix)
    if info is None:
        if is_mount_point(prefix) and os.path.exists(sidecar(prefix)):   # server died
            subprocess.run(["fusermount3", "-u", "-z", prefix], capture_output=True)
        return False
    pid = int(info["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while (pid_alive(pid) or is_mount_point(prefix)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    if is_mount_point(prefix):
        subprocess.run(["fusermount3", "-u", "-z", prefix], capture_output=True)
    try:
        os.unlink(sidecar(prefix))
    except FileNotFoundError:
        pass
    return True
