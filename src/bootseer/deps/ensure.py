"""``bootseer deps ensure``: make PREFIX hold the environment of SPEC, as fast as possible.

    warm node   PREFIX has this key's completion marker, or its mount -> return at once
    hit         the store has a snapshot for the key             -> fetch its blob, mount
                (the kernel has file-backed EROFS; ``restore``), else fetch,
                extract, rename (``copy``, no EROFS, a read-only mount of a snapshot
                made at another prefix)
    miss        lease the key (one builder across all nodes), build, snapshot, publish;
                the others wait for the publish up to a deadline, then build themselves

A node that has the key's blob mounts it without asking the store. An extracting restore
or a build happens in a temp dir next to PREFIX, renamed into place with the
completion marker written last: a killed restore or build leaves nothing half-visible, and
the next ensure removes what it left (``prefix``). A PREFIX that exists without a bootseer
marker is someone else's, and one that a running process uses is busy: refused, never
overwritten. A read-only store restores; on a miss the node installs without publishing.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from bootseer import redact
from bootseer import trace as tracing
from bootseer.config import BootseerConfig
from bootseer.deps import compat, place, relocate
from bootseer.deps.build import build
from bootseer.deps.gc import record_use
from bootseer.deps.lease import LEASE_TTL_S, Lease
from bootseer.deps.mounts import mount_env
from bootseer.deps.prefix import (
    Sibling,
    form,
    overlay_damage,
    read_marker,
    sweep_leftovers,
    sweep_stale_sidecar,
)
from bootseer.deps.resolve import DepsError, Resolved, python_of, resolve_key
from bootseer.deps.restore import mount_cached, restore
from bootseer.deps.snapshot import (
    check_driver,
    env_ref,
    load_manifest,
    pins_ref,
    portable_ref,
    publish,
    publish_manifest,
    write_marker,
)
from bootseer.errors import ReadOnlyStore, StoreError
from bootseer.store import open_store

log = logging.getLogger(__name__)
_PREFIX_LOCK = threading.RLock()


@dataclass(frozen=True)
class Result:
    how: str      # warm | restored | mounted | relocated | built | installed
    key: str
    prefix: str
    form: str = "directory"   # directory | mount (EROFS, a kernel restore) | lazy (FUSE)


@dataclass
class _Job:
    """One ensure: what was asked, and the resolve, done at most once and only when
    needed (a node that restores never asks the package index)."""

    spec: str
    prefix: str
    python: str
    index_urls: list[str] | None
    config: BootseerConfig
    progress: Callable[[int, int], None] | None
    mount: bool
    mount_window_s: float
    copy: bool
    writable: bool
    _resolved: Resolved | None = None

    @property
    def as_mount(self) -> bool:
        """Restores are kernel mounts where the kernel can (not a copy, not lazy)."""
        return not self.copy and not self.mount

    def resolved(self) -> Resolved:
        if self._resolved is None:
            with tracing.phase("deps.resolve"):
                self._resolved = resolve_key(self.spec, self.prefix, self.python,
                                             self.index_urls)
        return self._resolved

    def done(self, how: str, key: str) -> Result:
        record_use(self.config, self.prefix, key, how)
        return Result(how, key, self.prefix, form(self.prefix))


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
    job = _Job(spec, os.path.abspath(prefix), python or sys.executable, index_urls,
               config or BootseerConfig.from_env(), progress, mount, mount_window_s, copy,
               writable)
    prefix = job.prefix
    if key is None:
        key = job.resolved().key
    if _warm(prefix, key, copy):
        return job.done("warm", key)
    sweep_stale_sidecar(prefix)
    place.check_replaceable(prefix, key)     # before any work: foreign, or in use
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    store = open_store(job.config.store.url, job.config)
    with _prefix_locked(prefix):
        if _warm(prefix, key, copy, say=True):
            return job.done("warm", key)
        sweep_leftovers(prefix)
        # this node has the key's blob: mounted without the store
        if job.as_mount and mount_cached(job.config, prefix, key, writable=writable):
            return job.done("restored", key)
        got = _from_store(job, store, key, wait_s, lease_ttl_s)
        if isinstance(got, Result):
            return got
        return _install_here(job, why=got)


@contextmanager
def _prefix_locked(prefix: str):
    """One ensure per prefix on this node; lockf (not flock): never inherited by a
    process forked meanwhile, per process hence the thread lock."""
    with _PREFIX_LOCK, open(f"{prefix}.lock", "a+") as lf:
        fcntl.lockf(lf, fcntl.LOCK_EX)
        yield


def _warm(prefix: str, key: str, copy: bool, *, say: bool = False) -> bool:
    """PREFIX already holds ``key``'s environment, usable (with ``copy``: as a plain
    directory, not a mount). A kernel mount whose overlay hides files of the published
    environment (deleted through it: a job's ``rm -rf``) is not warm: it is mounted again
    as published, its overlay's changes dropped, and that is said."""
    marker = read_marker(prefix)
    if not marker or marker.get("key") != key:
        return False
    if copy and ("backend" in marker or "pid" in marker):
        return False
    damage = overlay_damage(prefix) if form(prefix) == "mount" else []
    if damage and say:   # said under the prefix's lock, by the ensure that mounts it again
        log.warning("%s: files of environment %s were deleted through its overlay (%s%s): "
                    "mounting it again as published, the overlay's changes dropped", prefix,
                    key[:19], ", ".join(damage[:3]), ", ..." if len(damage) > 3 else "")
    if damage:
        return False
    return True


def _from_store(job: _Job, store, key: str, wait_s: float, lease_ttl_s: float) -> Result | str:
    """The key's snapshot restored, or built here under the key's lease and published;
    while another node holds the lease, wait for its publish up to ``wait_s``. A string:
    why nothing came of it (the caller installs here)."""
    deadline = time.time() + wait_s
    lease = Lease(store, key, lease_ttl_s)
    while True:
        published = store.get_ref(env_ref(key))
        if published is not None:
            try:
                return _restore_published(job, store, published, key)
            except (StoreError, ValueError, KeyError) as e:
                # corrupt or unreachable snapshot: never a half env
                return f"restoring {key[:19]} failed ({redact.text(str(e))})"
        read_only = f"the store {redact.url(job.config.store.url)} is read-only"
        if not store.writable:
            return read_only
        try:
            leased = lease.acquire()
        except (StoreError, OSError) as e:
            if not _read_only(e):
                raise
            return read_only   # no lease
        if leased:
            try:
                return _build_and_publish(job, store, key)
            finally:
                lease.release()
        if time.time() > deadline:
            return f"no snapshot for {key[:19]} after {wait_s:.0f} s"
        time.sleep(0.5)


def _restore_published(job: _Job, store, published: str, key: str) -> Result:
    """The snapshot published under ``key``: lazily mounted (``mount``, when it was made
    at this prefix) or restored."""
    manifest = load_manifest(store, published, key)
    check_driver(manifest)
    if job.mount and manifest["prefix"] == job.prefix:
        place.clear(job.prefix)
        mount_env(job.config, manifest["tree"], job.prefix, key, window_s=job.mount_window_s)
        return job.done("mounted", key)
    if job.mount:
        log.info("the snapshot was made at %s: restoring (relocated) instead of mounting",
                 manifest["prefix"])
    restore(store, manifest, job.prefix, job.config, key, job.progress,
            as_mount=job.as_mount, writable=job.writable)
    return job.done("restored", key)


def _build_and_publish(job: _Job, store, key: str) -> Result:
    """Holding the key's lease: restore the same pins' snapshot if there is one, else
    build, publish, and put the environment in place."""
    r = job.resolved()
    if r.key != key:
        log.warning("given key %s does not match %s resolved here (index changed?): "
                    "publishing under %s", key[:19], job.spec, r.key[:19])
    compat.check(compat.cuda_runtime(r.locked), compat.driver_version(), f"{job.spec}")
    how = _restore_portable(job, store, r)
    if how is not None:
        return job.done(how, r.key)
    _say_why_new_key(store, r)
    with Sibling(job.prefix, "building") as b:
        with tracing.phase("deps.build"):
            build(r.locked, job.prefix, job.python, job.index_urls, root=b.path)
        # published only once built whole: a pin the artifacts fail stopped the install
        tree = publish(store, job.prefix, r.key, r.portable, pins_key=r.pins,
                       python=python_of(r.interp), root=b.path, config=job.config)
        write_marker(b.path, r.key, tree)
        place.put(b.path, job.prefix, r.key)
    return job.done("built", r.key)


def _install_here(job: _Job, why: str) -> Result:
    """No snapshot to be had (``why``): install on this node without publishing."""
    r = job.resolved()
    compat.check(compat.cuda_runtime(r.locked), compat.driver_version(), f"{job.spec}")
    log.warning("%s: installing %s on this node without publishing it", why, r.key[:19])
    with Sibling(job.prefix, "building") as b:
        with tracing.phase("deps.build", fallback=True):
            build(r.locked, job.prefix, job.python, job.index_urls, root=b.path)
        write_marker(b.path, r.key, None)
        place.put(b.path, job.prefix, r.key)
    return job.done("installed", r.key)


def _say_why_new_key(store, r: Resolved) -> None:
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


def _restore_portable(job: _Job, store, r: Resolved) -> str | None:
    """The same pins snapshotted already (at another prefix, or under another key when the
    key handed to us was stale): restore that snapshot here, rewriting the prefix, and
    publish it under this prefix's key (the tree is shared, not re-uploaded)."""
    d = store.get_ref(portable_ref(r.portable))
    if d is None:
        return None
    prefix = job.prefix
    try:
        manifest = load_manifest(store, d)
        relocate.check(manifest.get("relocations"), manifest["prefix"], prefix)
        check_driver(manifest)
        restore(store, manifest, prefix, job.config, r.key, job.progress,
                as_mount=job.as_mount, writable=job.writable)
    except DepsError as e:
        log.warning("%s: building at %s instead", e, prefix)
        return None
    except (StoreError, ValueError, KeyError) as e:
        log.warning("restoring the snapshot of the same pins failed (%s): building", e)
        return None
    publish_manifest(store, manifest, r.key)
    return "restored" if manifest["prefix"] == prefix else "relocated"
