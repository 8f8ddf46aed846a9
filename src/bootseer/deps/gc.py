"""The environments on this node, for ``bootseer deps gc``.

Every ``ensure`` records the prefix it served (one small JSON file per prefix next to the
node cache, rewritten atomically, so concurrent ensures never contend). ``gc`` removes
the least recently used environments until the rest fit under a size cap, and never one
that a running process uses: its ``<prefix>.lock`` is held (an ensure, a ``bootseer run``)
or ``/proc`` shows a process whose executable, command line, working directory, open
files or mapped libraries lie under the prefix. It removes only what it can prove is the
environment it recorded (``not_ours``): a directory a user put at the prefix since, with
or without a copied marker, is forgotten and left alone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from bootseer.config import BootseerConfig
from bootseer.deps.blobs import blob_bytes, cached_blob, drop_blob
from bootseer.deps.mounts import unmount
from bootseer.deps.prefix import Sibling, empty_or_absent, is_kernel, marker_of, mounted_info, users
from bootseer.node.procfs import LOCAL, ProcView

log = logging.getLogger(__name__)


def records_dir(config: BootseerConfig) -> Path:
    return Path(config.cache.dir).parent / "envs"


def record_use(config: BootseerConfig, prefix: str, key: str, how: str) -> None:
    """Record that ``prefix`` served ``key`` now, with what proves the directory is the one
    bootseer put there: its marker's id and the directory's device and inode."""
    d = records_dir(config)
    try:
        d.mkdir(parents=True, exist_ok=True)
        path = d / (hashlib.sha256(prefix.encode()).hexdigest()[:32] + ".json")
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        rec = {"prefix": prefix, "key": key, "how": how, "last_used": time.time()}
        marker = marker_of(prefix) if how != "mounted" else None
        if marker is not None and marker.get("id"):
            st = os.lstat(prefix)
            # an inode number is reused once freed: the change time tells a directory
            # made later at the same inode (a copy of the environment, marker and all)
            rec.update(id=marker["id"], dev=st.st_dev, ino=st.st_ino, ctime_ns=st.st_ctime_ns)
        tmp.write_text(json.dumps(rec))
        tmp.rename(path)
    except OSError as e:   # bookkeeping only: never fail an ensure for it
        log.warning("cannot record the use of %s: %s", prefix, e)


@dataclass
class NodeEnv:
    prefix: str
    key: str
    last_used: float
    bytes: int
    record: Path
    mounted: bool = False
    proof: dict | None = None
    """The record's ``id``, ``dev``, ``ino``, ``ctime_ns``: what the prefix must still show
    to be ours."""
    kernel: dict | None = None
    """A restore mounted by the kernel: its sidecar (the blob is its disk; the mount id
    the sidecar names, checked live, proves it is ours); or, unmounted, the node's record
    of its blob (``env-<key>.json``)."""


def not_ours(env: NodeEnv) -> str | None:
    """Why the directory at ``env.prefix`` is not (or no longer) the environment bootseer
    recorded, or None when its marker proves it is: the same key and marker id inside,
    the same directory (device, inode, change time) as when it was recorded."""
    if not env.proof or not env.proof.get("id"):
        return "its record predates ownership proofs"
    try:
        st = os.lstat(env.prefix)
    except OSError as e:
        return f"cannot stat it ({e.strerror})"
    if (st.st_dev, st.st_ino, st.st_ctime_ns) != \
            (env.proof.get("dev"), env.proof.get("ino"), env.proof.get("ctime_ns")):
        return "another directory is there now, or it was changed"
    marker = marker_of(env.prefix)
    if marker is None:
        return "it has no bootseer marker"
    if marker.get("key") != env.key or marker.get("id") != env.proof["id"]:
        return "its marker is not the one recorded"
    return None


def _size(path: str) -> int:
    total, seen = 0, set()
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def environments(config: BootseerConfig, view: ProcView = LOCAL) -> list[NodeEnv]:
    """Recorded environments that still exist, least recently used first (``view``:
    where the node's mounts are read)."""
    out = []
    for rec in sorted(records_dir(config).glob("*.json")):
        try:
            info = json.loads(rec.read_text())
        except (OSError, ValueError):
            continue
        prefix = info["prefix"]
        live = mounted_info(prefix, view)
        mounted = live is not None
        kernel = live if is_kernel(live) else None
        if not mounted and empty_or_absent(prefix):
            # unmounted (deps umount, a reboot): its blob stays for the next mount
            kernel = cached_blob(config, info["key"])
        if not mounted and not kernel and not os.path.isdir(prefix):
            rec.unlink(missing_ok=True)    # removed by hand: forget it
            continue
        # a lazy mount holds no disk of its own (its chunks are in the node cache); a
        # kernel restore holds its blob
        proof = {k: info[k] for k in ("id", "dev", "ino", "ctime_ns") if k in info}
        size = blob_bytes(kernel) if kernel else 0 if mounted else _size(prefix)
        if kernel and not size:
            continue    # its blob is gone: nothing of it on this node to remove
        out.append(NodeEnv(prefix, info["key"], info["last_used"], size, rec, mounted, proof,
                           kernel))
    return sorted(out, key=lambda e: e.last_used)


def gc(config: BootseerConfig, max_bytes: int, *, dry_run: bool = False,
       view: ProcView = LOCAL) -> list[tuple[NodeEnv, str]]:
    """Remove least-recently-used environments until the others fit in ``max_bytes``.
    Returns ``(env, action)`` for each one considered: removed, in use, or kept.
    ``view``: where the node's processes and mounts are read (``node.procfs.node_view``:
    from a pod, the host's)."""
    envs = environments(config, view)
    total = sum(e.bytes for e in envs)
    report = []
    for env in envs:
        if total <= max_bytes or (env.mounted and not env.kernel):   # lazy: no disk of its own
            report.append((env, "kept"))
            continue
        lock = open(f"{env.prefix}.lock", "a+")
        try:
            try:
                fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                report.append((env, "in use (ensure or run holds its lock)"))
                continue
            if env.kernel:
                report.append(_drop_mounted(config, env, env.kernel, dry_run, view))
                if not report[-1][1].startswith("in use"):
                    total -= env.bytes
                continue
            why = not_ours(env)
            if why is not None:    # never remove what the marker does not prove is ours
                if not dry_run:
                    env.record.unlink(missing_ok=True)
                report.append((env, f"forgotten, not removed ({why})"))
                total -= env.bytes
                continue
            pids = users(env.prefix, view=view)
            if pids:
                report.append((env, f"in use (pid {', '.join(map(str, pids[:5]))})"))
                continue
            if not dry_run:
                with Sibling(env.prefix, "old") as gone:    # vanishes whole, never half
                    os.rename(env.prefix, gone.path)
                env.record.unlink(missing_ok=True)
            total -= env.bytes
            report.append((env, "removed" if not dry_run else "would remove"))
        finally:
            lock.close()
    return report


def _drop_mounted(config: BootseerConfig, env: NodeEnv, kernel: dict,
                  dry_run: bool, view: ProcView) -> tuple[NodeEnv, str]:
    """Unmount an unused kernel restore (if mounted) and remove its blob (its lock is held
    by gc); ``kernel`` is its sidecar, ``env.kernel``."""
    pids = users(env.prefix, view=view)
    if pids:
        return env, f"in use (pid {', '.join(map(str, pids[:5]))})"
    if not dry_run:
        unmount(env.prefix)
        drop_blob(config, env.key, kernel)
        env.record.unlink(missing_ok=True)
        try:
            os.rmdir(env.prefix)    # the empty mount point: the environment is gone whole
        except OSError:
            pass
    return env, "removed" if not dry_run else "would remove"
