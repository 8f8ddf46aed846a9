"""``bootseer deps ensure``: make PREFIX hold the environment of SPEC, as fast as possible.

    warm node   PREFIX has this key's completion marker          -> return at once
    hit         the store has a snapshot for the key             -> fetch, extract, rename
    miss        lease the key (one builder across all nodes), build, snapshot, publish;
                the others wait for the publish up to a deadline, then build themselves

A restore extracts into a temp dir next to PREFIX and renames it into place with the
completion marker written last: a killed restore leaves nothing half-visible. A PREFIX
that exists without a bootseer marker is someone else's: refused, never overwritten.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bootseer.config import BootseerConfig
from bootseer.deps.resolve import DepsError, FORMAT, resolve_key
from bootseer.errors import StoreError
from bootseer import trace as tracing
from bootseer.store import open_store
from bootseer.store.digest import sha256_digest

log = logging.getLogger(__name__)
MARKER = ".bootseer-env.json"
LEASE_TTL_S = 120.0
_PREFIX_LOCK = threading.RLock()


@dataclass
class Result:
    how: str      # warm | restored | built | installed
    key: str
    prefix: str


def env_ref(key: str) -> str:
    return f"deps/env/{key.removeprefix('sha256:')}"


def lease_ref(key: str) -> str:
    return f"deps/lease/{key.removeprefix('sha256:')}"


def read_marker(prefix: str) -> dict | None:
    try:
        return json.loads((Path(prefix) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _write_marker(prefix: str, key: str, tree: str | None) -> None:
    tmp = Path(prefix) / f"{MARKER}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, "key": key, "tree": tree,
                               "created": time.time()}))
    tmp.rename(Path(prefix) / MARKER)


def _check_prefix(prefix: str) -> None:
    p = Path(prefix)
    if p.exists() and any(p.iterdir()) and read_marker(prefix) is None:
        raise DepsError(f"{prefix} exists and was not made by bootseer (no {MARKER}): "
                        f"refusing to overwrite it; choose another --prefix or remove it")


class Lease:
    """A TTL lease on a key in the store: a ref to a small JSON blob (owner, expiry),
    created only if absent; renewed by a thread while building; expired leases are
    taken over."""

    def __init__(self, store, key: str, ttl: float = LEASE_TTL_S):
        self.store, self.key, self.ttl = store, key, ttl
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()

    def _blob(self) -> str:
        data = json.dumps({"owner": self.owner, "expires": time.time() + self.ttl}).encode()
        d = sha256_digest(data)
        self.store.write(d, data)
        return d

    def acquire(self) -> bool:
        if self.store.set_ref(lease_ref(self.key), self._blob(), exclusive=True):
            threading.Thread(target=self._renew, daemon=True).start()
            return True
        current = self.store.get_ref(lease_ref(self.key))
        if current is not None:
            try:
                info = json.loads(self.store.read(current))
            except (OSError, ValueError):
                info = {"expires": 0}
            if info.get("expires", 0) < time.time():
                log.warning("lease on %s held by %s expired: taking over", self.key[:19],
                            info.get("owner"))
                self.store.delete_ref(lease_ref(self.key))
                return self.acquire()
        return False

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.store.set_ref(lease_ref(self.key), self._blob())
            except OSError as e:
                log.warning("cannot renew lease: %s", e)

    def release(self) -> None:
        self._stop.set()
        try:
            self.store.delete_ref(lease_ref(self.key))
        except OSError:
            pass


def restore(store, manifest_digest: str, prefix: str, config: BootseerConfig, key: str,
            progress: Callable[[int, int], None] | None = None) -> None:
    """Fetch and extract the snapshot into a temporary sibling, then rename it into place.
    ``progress(bytes, total)`` is called as chunks arrive."""
    from bootseer.store.cache import NodeCache
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.extract import extract
    from bootseer.tree.reader import TreeReader
    manifest = json.loads(store.read(manifest_digest))
    _sweep_leftovers(prefix)
    tmp = f"{prefix}.restoring-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tracing.phase("deps.fetch") as span, Fetcher(config.fetch) as f:
            reader = TreeReader(store, manifest["tree"], f, NodeCache(config.cache))
            total = sum(c[4] for c in reader.all_chunks())
            n = extract(reader, tmp, readonly=True,
                        progress=(lambda b: progress(b, total)) if progress else None)
            span.set(bytes=n)
        os.chmod(tmp, 0o755)
        _write_marker(tmp, key, manifest["tree"])
        old = f"{prefix}.old-{os.getpid()}"
        if os.path.exists(prefix):
            os.rename(prefix, old)
        os.rename(tmp, prefix)
        _rmtree(old)
    except BaseException:
        _rmtree(tmp)
        raise


def _sweep_leftovers(prefix: str) -> None:
    """Remove ``<prefix>.restoring-<pid>`` / ``.old-<pid>`` left by a killed process (the
    prefix itself is only ever renamed into place whole, so it is never partial)."""
    import glob
    for path in glob.glob(f"{glob.escape(prefix)}.restoring-*") + \
            glob.glob(f"{glob.escape(prefix)}.old-*"):
        pid = path.rsplit("-", 1)[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _rmtree(path)


def _rmtree(path: str) -> None:
    if os.path.exists(path):
        for root, dirs, _ in os.walk(path):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        os.chmod(path, 0o755)
        shutil.rmtree(path, ignore_errors=True)


def publish(store, prefix: str, key: str) -> str:
    from bootseer.tree.build import TreeBuilder, add_directory
    with tracing.phase("deps.publish"):
        b = TreeBuilder(store)
        add_directory(b, prefix)
        tree = b.finish(meta={"kind": "bootseer.env", "key": key, "prefix": prefix})
        manifest = json.dumps({"format": FORMAT, "key": key, "tree": tree, "prefix": prefix,
                               "created": time.time()}).encode()
        d = sha256_digest(manifest)
        store.write(d, manifest)
        store.set_ref(env_ref(key), d)
        return tree


def ensure(spec: str, prefix: str, *, python: str | None = None, index_urls=None,
           key: str | None = None, config: BootseerConfig | None = None,
           wait_s: float = 600.0, lease_ttl_s: float = LEASE_TTL_S,
           progress: Callable[[int, int], None] | None = None) -> Result:
    """Make ``prefix`` hold the environment of ``spec``: warm, restored, built once per key
    across nodes, or (no snapshot in time, store read-only) installed here.

    With ``key`` (resolved once per job by the launcher), nothing is resolved unless this
    node ends up building: a cold node restores, or waits for the one builder, without
    touching the package index, so N nodes cost the index one build's requests."""
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

    if key is None:
        key = resolve_once().key
    m = read_marker(prefix)
    if m and m.get("key") == key:
        return Result("warm", key, prefix)
    _check_prefix(prefix)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    store = open_store(config.store.url, config)
    # one ensure per prefix on this node; lockf (not flock): never inherited by a process
    # forked meanwhile, per process hence the thread lock
    with _PREFIX_LOCK, open(f"{prefix}.lock", "a+") as lf:
        fcntl.lockf(lf, fcntl.LOCK_EX)
        m = read_marker(prefix)
        if m and m.get("key") == key:
            return Result("warm", key, prefix)
        deadline = time.time() + wait_s
        lease = Lease(store, key, lease_ttl_s)
        while True:
            published = store.get_ref(env_ref(key))
            if published is not None:
                try:
                    restore(store, published, prefix, config, key, progress)
                    return Result("restored", key, prefix)
                except StoreError as e:  # corrupt or unreachable snapshot: never a half env
                    log.warning("restoring %s failed (%s): installing on this node", key[:19], e)
                    break
            if not store.writable:
                break
            if lease.acquire():
                try:
                    r = resolve_once()
                    if r.key != key:
                        log.warning("given key %s does not match %s resolved here (index "
                                    "changed?): publishing under %s", key[:19], spec,
                                    r.key[:19])
                    with tracing.phase("deps.build"):
                        from bootseer.deps.build import build
                        build(r.locked, prefix, python, index_urls)
                    tree = publish(store, prefix, r.key)
                    _write_marker(prefix, r.key, tree)
                    return Result("built", r.key, prefix)
                except BaseException:
                    _rmtree(prefix)
                    raise
                finally:
                    lease.release()
            if time.time() > deadline:
                log.warning("no snapshot for %s after %.0f s", key[:19], wait_s)
                break
            time.sleep(0.5)
        r = resolve_once()
        log.warning("installing %s on this node", r.key[:19])
        with tracing.phase("deps.build", fallback=True):
            from bootseer.deps.build import build
            build(r.locked, prefix, python, index_urls)
        _write_marker(prefix, r.key, None)
        return Result("installed", r.key, prefix)
