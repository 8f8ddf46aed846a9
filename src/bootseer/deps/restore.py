"""Restoring a published snapshot at a prefix, as a kernel mount where the serving seam
says so (``bootseer.mount.choose``), else as an extracted copy.

- Mount: the snapshot's whole data blob fetched onto the node (``blobs``, every chunk
  verified) and EROFS mounted on it at the prefix (``mounts``), from the tree's metadata
  image (the node's image cache, ``bootseer.mount.erofs.images``). No Python serves a
  read; nothing is extracted. A metadata image that does not match its sum is written
  again, a blob that fails is fetched again: neither is ever mounted.
- Lazy (``mount.env_lazy``, the node lacks the blob): the same mount at once on the
  blob as a server fills it (``lazy``, ``fill``); the blob it leaves is today's.
- Copy: extracted into a temporary sibling of the prefix, relocated if the snapshot was
  made at another prefix (``relocate``), renamed into place with the completion marker
  written last, so a killed restore leaves nothing half-visible.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bootseer import trace as tracing
from bootseer.config import BootseerConfig
from bootseer.deps import blobs, compat, lazy, place, relocate
from bootseer.deps.mounts import KernelMountError, mount_kernel, sweep
from bootseer.deps.prefix import Sibling, mounted_info, state_dir, sweep_leftovers
from bootseer.deps.resolve import DepsError
from bootseer.deps.snapshot import write_marker
from bootseer.errors import MountError
from bootseer.mount.choose import What, choose
from bootseer.mount.erofs import images, kernel
from bootseer.store.client import StoreClient
from bootseer.tree import meta_image
from bootseer.tree.blob import BlobLayout, unsupported
from bootseer.tree.extract import extract as extract_tree
from bootseer.tree.reader import TreeReader

log = logging.getLogger(__name__)


def restore(store, manifest: dict, prefix: str, config: BootseerConfig, key: str, progress,
            *, as_mount: bool, writable: bool) -> None:
    """Restore as a kernel mount when asked and possible, else by extraction. A snapshot
    made at another prefix needs rewritten files: they go into the mount's overlay, so a
    read-only mount of it cannot be: extracted (and relocated)."""
    kernel_path = as_mount and choose(config, What.ENV) is not None
    if kernel_path and manifest["prefix"] != prefix and not writable:
        log.info("the snapshot was made at %s: its rewritten files need a writable mount, "
                 "extracting a relocated copy at %s instead", manifest["prefix"], prefix)
    elif kernel_path:
        try:
            mount_restore(config, store, manifest, prefix, key, writable=writable,
                          progress=progress)
            return
        except kernel.ErofsMountError as e:   # mount(2) refused: the tree or this kernel
            log.warning("%s: extracting the environment instead", e)
        except MountError as e:
            log.warning("cannot mount the environment (%s): extracting it instead", e)
    extract(store, manifest, prefix, config, key, progress)


# -- as a copy --------------------------------------------------------------------------------
def extract(store, manifest: dict, prefix: str, config: BootseerConfig, key: str,
            progress: Callable[[int, int], None] | None = None) -> None:
    """Fetch and extract the snapshot into a temporary sibling, relocate it if it was
    made at another prefix, then rename it into place. ``progress(bytes, total)`` is
    called as chunks arrive."""
    made_at = manifest["prefix"]
    relocate.check(manifest.get("relocations"), made_at, prefix)   # before fetching
    sweep_leftovers(prefix)
    with Sibling(prefix, "restoring") as tmp:
        # Fetching and extracting overlap (files are written as their chunks arrive): two
        # phases, deps.fetch up to the last chunk's arrival, deps.extract until written.
        t0 = time.time()
        timing: dict = {}
        client = StoreClient.of(config)
        with tracing.phase("deps.extract") as span, client.lane() as f:
            reader = TreeReader(store, manifest["tree"], f, client.cache)
            total = sum(c.size for c in reader.all_chunks())
            from bootseer.tree.peers import fetch_tree  # the job's peers first
            span.set(**(fetch_tree(config, store, reader) or {}))
            n = extract_tree(reader, tmp.path, readonly=True, timing=timing,
                             progress=(lambda b: progress(b, total)) if progress else None)
            span.set(bytes=n)
            counters = f.counters()
        tracing.emit("deps.fetch", t0, timing.get("fetched_at", t0),
                     chunks=timing.get("chunks", 0), bytes=counters["bytes"],
                     requests=counters["requests"])
        extra = {}
        if made_at != prefix:
            with tracing.phase("deps.relocate") as span:
                span.set(paths=relocate.rewrite(tmp.path, manifest["relocations"], made_at,
                                                prefix))
            extra["relocated"] = {"from": made_at, **manifest["relocations"]}
        os.chmod(tmp.path, 0o755)
        write_marker(tmp.path, key, manifest["tree"], **extra)
        place.put(tmp.path, prefix, key)


# -- as a mount -------------------------------------------------------------------------------
def mount_cached(config: BootseerConfig, prefix: str, key: str, *, writable: bool) -> bool:
    """Mount ``key``'s environment at ``prefix`` from the blob and metadata image this
    node already has, without the store. False when it has not (or they changed: the
    store path then checks them)."""
    rec = blobs.cached_blob(config, key)
    if rec is None:
        return False
    if choose(config, What.ENV) is None:
        return False   # the restore from the store extracts
    compat.check(rec.get("cuda"), compat.driver_version(), f"the environment {key[:19]}")
    blob, meta = rec.get("blob"), rec.get("meta")
    if not (isinstance(blob, str) and isinstance(meta, str)) or \
            not blobs.verified_unchanged(blob) or not images.matches(meta):
        return False
    if rec.get("relocated") and not writable:
        return False   # the store path says why and extracts
    place.clear(prefix)
    mount_kernel(prefix, key, rec["tree"], meta, blob, writable=writable,
                 relocated=rec.get("relocated"))
    return True


def mount_restore(config: BootseerConfig, store, manifest: dict, prefix: str, key: str, *,
                  writable: bool, progress: Callable[[int, int], None] | None = None) -> None:
    """Fetch the snapshot's blob (what the node lacks), check it and its metadata image,
    and mount them at ``prefix``, replacing what bootseer had there (``place.clear``)
    once they are local. Raises KernelMountError (nothing mounted) when this tree cannot
    be a kernel mount here; the caller extracts instead. Whatever fails leaves neither a
    mount nor state beside the prefix."""
    try:
        _fetch_and_mount(config, store, manifest, prefix, key, writable=writable,
                         progress=progress)
    except BaseException:
        if mounted_info(prefix) is None:   # never the state of a live mount (another key's)
            sweep(prefix)
        raise


def _fetch_and_mount(config: BootseerConfig, store, manifest: dict, prefix: str, key: str,
                     *, writable: bool, progress) -> None:
    tree = manifest["tree"]
    relocated = None
    if manifest["prefix"] != prefix:   # before fetching: refused when a binary names it
        relocate.check(manifest.get("relocations"), manifest["prefix"], prefix)
        relocated = {"from": manifest["prefix"], **manifest["relocations"]}
    for path in (prefix, state_dir(prefix)):
        if "," in path or ":" in path:   # overlay and EROFS options cannot quote them
            raise KernelMountError(f"the path {path} has a ',' or ':'")
    state = Path(state_dir(prefix))
    state.mkdir(parents=True, exist_ok=True)
    why = images.place_problem(config.cache.dir, str(state))   # before fetching anything
    if why is not None:
        raise KernelMountError(why)
    client = StoreClient.of(config)
    with client.lane() as f:
        reader = TreeReader(store, tree, f, client.cache)
        why = unsupported(reader.toc)
        if why is not None:
            raise KernelMountError(f"the snapshot's tree cannot be an EROFS image: {why}")
        layout = BlobLayout(reader.toc)
        # the metadata image (the snapshot's stored one, else written here: a second or
        # two for 20k files) is fetched while the blob is
        made: dict = {}

        def write_meta() -> None:
            # its own cache entry: the lazy mount of the same tree keeps every bit
            try:
                made["meta"] = str(images.metadata_image(
                    config.cache.dir, f"{tree}:env", layout.key, state,
                    lambda: meta_image.image(config, tree, reader.toc, layout, "env")))
            except BaseException as e:  # noqa: BLE001 - raised in the restoring thread
                made["error"] = e
        blob_file = str(blobs.blob_path(config, layout))
        if config.mount.env_lazy and not os.path.exists(blob_file):
            try:
                lazy.restore(config, store, manifest, prefix, key, layout, write_meta, made,
                             blob_file, state, writable=writable, relocated=relocated)
                return
            except DepsError as why:   # its server did not start: nothing is mounted
                log.warning("%s: fetching the whole blob instead", why)
                made.clear()
        writer = threading.Thread(target=write_meta, name="bootseer-erofs-meta")
        writer.start()
        try:
            blob = blobs.local_blob(config, store, reader, layout, key, f, progress,
                                    str(blobs.blob_path(config, layout)))
        finally:
            writer.join()
    if "error" in made:
        e = made["error"]
        if isinstance(e, kernel.ErofsMountError):
            raise KernelMountError(str(e)) from e
        raise e
    blobs.remember(config, key, {"tree": tree, "blob": blob, "meta": made["meta"],
                                 "layout": layout.key, "cuda": manifest.get("cuda"),
                                 "relocated": relocated})
    place.clear(prefix)   # what was there stays until the new environment is local
    mount_kernel(prefix, key, tree, made["meta"], blob, writable=writable, relocated=relocated)
