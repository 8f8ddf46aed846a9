"""``bootseer deps ensure``: make PREFIX hold the environment of SPEC, as fast as possible.

    warm node   PREFIX has this key's completion marker, or its mount -> return at once
    hit         the store has a snapshot for the key             -> fetch its blob, mount
                (the kernel has file-backed EROFS; ``kernel_restore``), else fetch,
                extract, rename (``copy``, no EROFS, a read-only mount of a snapshot
                made at another prefix)
    miss        lease the key (one builder across all nodes), build, snapshot, publish;
                the others wait for the publish up to a deadline, then build themselves

A node that has the key's blob mounts it without asking the store. An extracting restore
or a build happens in a temp dir next to PREFIX, renamed into place with the
completion marker written last: a killed restore or build leaves nothing half-visible, and
the next ensure removes what it left (``place``). A PREFIX that exists without a bootseer
marker is someone else's, and one that a running process uses is busy: refused, never
overwritten. A read-only store restores; on a miss the node installs without publishing.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bootseer import redact, trace as tracing
from bootseer.config import BootseerConfig
from bootseer.deps import compat, relocate
from bootseer.deps.lease import LEASE_TTL_S, Lease
from bootseer.deps.resolve import DepsError, python_of, resolve_key
from bootseer.deps import place
from bootseer.deps.snapshot import (check_driver, env_ref, load_manifest, pins_ref,
                                    portable_ref, publish, publish_manifest, read_marker,
                                    restore, write_marker)
from bootseer.errors import ReadOnlyStore, StoreError
from bootseer.store import open_store

log = logging.getLogger(__name__)
_PREFIX_LOCK = threading.RLock()


@dataclass
class Result:
    how: str      # warm | restored | mounted | relocated | built | installed
    key: str
    prefix: str
    form: str = "directory"   # directory | mount (EROFS, a kernel restore) | lazy (FUSE)


def _read_only(e: BaseException) -> bool:
    return isinstance(e, ReadOnlyStore) or (isinstance(e, OSError) and
                                            e.errno in (errno.EROFS, errno.EACCES, errno.EPERM))


def ensure(spec: str, prefix: str, *, python: str | None = None, index_urls=None,
           key: str | None = None, config: BootseerConfig | None = None,
           wait_s: float = 600.0, lease_ttl_s: float = LEASE_TTL_S,
           progress: Callable[[int, int], None] | None = None, mount: bool = False,
           mount_window_s: float = 120.0, copy: bool = False,
           writable: bool = True) -> Result:
    """Make ``prefix`` hold the environment of ``spec``: warm, restored (or lazily mounted
    with ``mount``), relocated from the same pins at another prefix, built once per key
    across nodes, or (no snapshot in time, store read-only) installed here.

    A restore is a kernel mount of the snapshot's blob where the kernel can (writable
    through an overlay unless ``writable`` is False); ``copy`` extracts a plain
    directory instead, as does a kernel without file-backed EROFS (said once).

    With ``key`` (resolved once per job by the launcher), nothing is resolved unless this
    node ends up building: a cold node restores, or waits for the one builder, without
    touching the package index, so N nodes cost the index one build's requests.

    Whatever is at ``prefix`` stays until the new environment is complete beside it, and
    is replaced only when bootseer made it and no process uses it."""
    import sys
    config = config or BootseerConfig.from_env()
    prefix = os.path.abspath(prefix)
    python = python or sys.executable
    resolved = None

    def resolve_once():
        nonlocal resolved
        if resolved is None:
            with tracing.phase("deps.resolve"):
                resolved = resolve_key(spec, prefix, python, index_urls)
        return resolved

    def done(how: str, k: str) -> Result:
        from bootseer.deps.mounted import is_kernel, mounted_info
        from bootseer.deps.node import record_use
        record_use(config, prefix, k, how)
        info = mounted_info(prefix)
        form = "directory" if info is None else "mount" if is_kernel(info) else "lazy"
        return Result(how, k, prefix, form)

    if key is None:
        key = resolve_once().key
    m = read_marker(prefix)
    if _warm(m, key, copy):
        return done("warm", key)
    as_mount = not copy and not mount
    place.sweep_stale_sidecar(prefix)
    place.check_replaceable(prefix, key)     # before any work: foreign, or in use
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    store = open_store(config.store.url, config)
    # one ensure per prefix on this node; lockf (not flock): never inherited by a process
    # forked meanwhile, per process hence the thread lock
    with _PREFIX_LOCK, open(f"{prefix}.lock", "a+") as lf:
        fcntl.lockf(lf, fcntl.LOCK_EX)
        m = read_marker(prefix)
        if _warm(m, key, copy):
            return done("warm", key)
        place.sweep_leftovers(prefix)
        # this node has the key's blob: mounted without the store
        if as_mount:
            from bootseer.deps import kernel_restore
            if kernel_restore.mount_cached(config, prefix, key, writable=writable):
                return done("restored", key)
        deadline = time.time() + wait_s
        lease = Lease(store, key, lease_ttl_s)
        why = "no snapshot"
        while True:
            published = store.get_ref(env_ref(key))
            if published is not None:
                try:
                    manifest = load_manifest(store, published)
                    check_driver(manifest)
                    if mount and manifest["prefix"] == prefix:
                        from bootseer.deps.mounted import mount_env
                        place.clear(prefix)
                        mount_env(config, manifest["tree"], prefix, key, window_s=mount_window_s)
                        return done("mounted", key)
                    if mount:
                        log.info("the snapshot was made at %s: restoring (relocated) instead "
                                 "of mounting", manifest["prefix"])
                    _restore(store, manifest, prefix, config, key, progress,
                             as_mount=as_mount, writable=writable)
                    return done("restored", key)
                except (StoreError, ValueError, KeyError) as e:
                    # corrupt or unreachable snapshot: never a half env
                    why = f"restoring {key[:19]} failed ({redact.text(str(e))})"
                    break
            if not store.writable:
                why = f"the store {redact.url(config.store.url)} is read-only"
                break
            try:
                leased = lease.acquire()
            except (StoreError, OSError) as e:
                if not _read_only(e):
                    raise
                why = f"the store {redact.url(config.store.url)} is read-only"   # no lease
                break
            if leased:
                try:
                    r = resolve_once()
                    if r.key != key:
                        log.warning("given key %s does not match %s resolved here (index "
                                    "changed?): publishing under %s", key[:19], spec,
                                    r.key[:19])
                    compat.check(compat.cuda_runtime(r.locked), compat.driver_version(),
                                 f"{spec}")
                    how = _restore_portable(store, r, prefix, config, progress,
                                            as_mount=as_mount, writable=writable)
                    if how is not None:
                        return done(how, r.key)
                    _say_why_new_key(store, r)
                    with place.Sibling(prefix, "building") as b:
                        with tracing.phase("deps.build"):
                            from bootseer.deps.build import build
                            build(r.locked, prefix, python, index_urls, root=b.path)
                        # published only once built whole: a pin the artifacts fail
                        # stopped the install above
                        tree = publish(store, prefix, r.key, r.portable, pins_key=r.pins,
                                       python=python_of(r.interp), root=b.path,
                                       config=config)
                        write_marker(b.path, r.key, tree)
                        place.put(b.path, prefix, r.key)
                    return done("built", r.key)
                finally:
                    lease.release()
            if time.time() > deadline:
                why = f"no snapshot for {key[:19]} after {wait_s:.0f} s"
                break
            time.sleep(0.5)
        r = resolve_once()
        compat.check(compat.cuda_runtime(r.locked), compat.driver_version(), f"{spec}")
        log.warning("%s: installing %s on this node without publishing it", why, r.key[:19])
        with place.Sibling(prefix, "building") as b:
            with tracing.phase("deps.build", fallback=True):
                from bootseer.deps.build import build
                build(r.locked, prefix, python, index_urls, root=b.path)
            write_marker(b.path, r.key, None)
            place.put(b.path, prefix, r.key)
        return done("installed", r.key)


def _warm(marker: dict | None, key: str, copy: bool) -> bool:
    """PREFIX already holds ``key``'s environment (with ``copy``: as a plain directory,
    not a mount)."""
    if not marker or marker.get("key") != key:
        return False
    return not copy or ("backend" not in marker and "pid" not in marker)


def _say_why_new_key(store, r) -> None:
    """These pins were snapshotted for another interpreter or platform: say so, since
    that snapshot cannot serve this node (its compiled extensions and bytecode are built
    for the other ABI), and this node builds under its own key."""
    try:
        d = store.get_ref(pins_ref(r.pins))
        other = load_manifest(store, d).get("python") if d else None
    except (StoreError, ValueError, KeyError):
        return
    ours = python_of(r.interp)
    if other and other != ours:
        log.warning("a snapshot of these pins exists for %s, but this node runs %s: "
                    "building for this interpreter under key %s", other, ours, r.key[:19])


def _restore(store, manifest: dict, prefix: str, config: BootseerConfig, key: str, progress,
             *, as_mount: bool, writable: bool) -> None:
    """Restore as a kernel mount when asked and possible, else by extraction. A snapshot
    made at another prefix needs rewritten files: they go into the mount's overlay, so a
    read-only mount of it cannot be: extracted (and relocated)."""
    from bootseer.deps import kernel_restore
    from bootseer.mount.erofs import kernel
    why = kernel_restore.unavailable(config) if as_mount else None
    if why is not None:
        kernel_restore.say_fallback(why)
    elif as_mount and manifest["prefix"] != prefix and not writable:
        log.info("the snapshot was made at %s: its rewritten files need a writable mount, "
                 "extracting a relocated copy at %s instead", manifest["prefix"], prefix)
    elif as_mount:
        try:
            kernel_restore.mount_restore(config, store, manifest, prefix, key,
                                         writable=writable, progress=progress)
            return
        except kernel_restore.KernelMountError as e:
            log.warning("cannot mount the environment (%s): extracting it instead", e)
        except kernel.ErofsMountError as e:   # mount(2) refused: the tree or this kernel
            log.warning("%s: extracting the environment instead", e)
    restore(store, manifest, prefix, config, key, progress)


def _restore_portable(store, r, prefix: str, config: BootseerConfig, progress, *,
                      as_mount: bool, writable: bool) -> str | None:
    """The same pins snapshotted already (at another prefix, or under another key when the
    key handed to us was stale): restore that snapshot here, rewriting the prefix, and
    publish it under this prefix's key (the tree is shared, not re-uploaded)."""
    d = store.get_ref(portable_ref(r.portable))
    if d is None:
        return None
    try:
        manifest = load_manifest(store, d)
        relocate.check(manifest.get("relocations"), manifest["prefix"], prefix)
        check_driver(manifest)
        _restore(store, manifest, prefix, config, r.key, progress, as_mount=as_mount,
                 writable=writable)
    except DepsError as e:
        log.warning("%s: building at %s instead", e, prefix)
        return None
    except (StoreError, ValueError, KeyError) as e:
        log.warning("restoring the snapshot of the same pins failed (%s): building", e)
        return None
    publish_manifest(store, manifest, r.key)
    return "restored" if manifest["prefix"] == prefix else "relocated"
