"""An environment restore as a kernel mount: the snapshot's whole data blob fetched into
the node cache (``<cache>/erofs/<layout>.blob``, every chunk verified) and EROFS mounted
on it at the prefix, from the tree's metadata image (``tree.blob_mount.metadata_image``).
No Python serves a read; nothing is extracted.

Writable by default: an overlay at the prefix, EROFS its lower layer, upper and work
directories in ``<prefix>.mount-state/``, so a job that writes into its environment
(``pip install``, ``__pycache__``) behaves as it does in an extracted one; its writes are
dropped at ``deps umount``, the blob is never written. ``writable=False`` mounts EROFS
alone (read-only: exactly the snapshot).

``<prefix>.mount.json`` (key, tree, blob, the mount's id) names the live mount; it is
written before the mount and completed after it, so a command killed in between leaves a
mount the next ensure recognises as ours and undoes. A blob is re-verified chunk by
chunk when its file changed since it was last verified (``<blob>.verified`` holds the
size, inode, mtime and ctime it had then: any write changes the ctime); one unchanged is
mounted at once, in the boot that verified it: a crash can leave a renamed blob whose
data never reached the disk (it is written without fsync), so after a reboot every blob
is re-verified once. A blob that fails is removed and fetched again; a metadata image that
does not match its sum is written again: neither is ever mounted.
``<cache>/erofs/env-<key>.json`` remembers which blob and metadata image serve a key, so
a node with them mounts without asking the store.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from bootseer import trace as tracing
from bootseer.config import BootseerConfig
from bootseer.deps import place, relocate
from bootseer.deps.mounted import KERNEL_BACKEND, is_mount_point, sidecar, state_dir
from bootseer.errors import BootseerError, StoreError
from bootseer.node import mounts as points
from bootseer.mount.erofs import kernel

log = logging.getLogger(__name__)
_fallback_said = False


class KernelMountError(BootseerError):
    pass


def unavailable(config: BootseerConfig) -> str | None:
    """Why restores cannot be kernel mounts here (None: they can). ``mount.backend``
    ``fuse`` turns the kernel path off; ``erofs`` on a kernel without it is an error."""
    if config.mount.backend == "fuse":
        return "BOOTSEER_MOUNT_BACKEND=fuse"
    why = kernel.availability()
    if why is not None and config.mount.backend == "erofs":
        raise kernel.ErofsMountError(f"BOOTSEER_MOUNT_BACKEND=erofs but {why} (set it to auto "
                                     "to restore environments by extraction)")
    return why


def say_fallback(why: str) -> None:
    """Once per process: restores extract, and why."""
    global _fallback_said
    if not _fallback_said:
        _fallback_said = True
        log.warning("environments are restored by extraction, not mounted: %s", why)


# -- the node's record of a key's blob ----------------------------------------------------
def _erofs_dir(config: BootseerConfig) -> Path:
    return Path(config.cache.dir) / "erofs"


def env_blob_path(config: BootseerConfig, layout) -> Path:
    """Where environments keep a blob: ``deps gc`` is the only one to remove it (lazy
    images keep theirs apart, in ``erofs/trees``, and make room among those only)."""
    return _erofs_dir(config) / f"{layout.key}.blob"


def _index_path(config: BootseerConfig, key: str) -> Path:
    return _erofs_dir(config) / f"env-{key.removeprefix('sha256:')}.json"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""   # never equal to a recorded one: re-verified


def _stamp(path: str) -> dict:
    """What a blob shows while unchanged since it was verified, in this boot."""
    st = os.stat(path)
    return {"size": st.st_size, "dev": st.st_dev, "ino": st.st_ino,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "boot": _boot_id()}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _verified_unchanged(blob: str) -> bool:
    try:
        stamp = _stamp(blob)
        return bool(stamp["boot"]) and json.loads(Path(blob + ".verified").read_text()) == stamp
    except (OSError, ValueError):
        return False


def _meta_matches(meta: str) -> bool:
    """The metadata image still hashes to the sum written beside it."""
    try:
        want = Path(meta + ".sha256").read_text().strip()
        return hashlib.sha256(Path(meta).read_bytes()).hexdigest() == want
    except OSError:
        return False


# -- the restore ------------------------------------------------------------------------------
def mount_cached(config: BootseerConfig, prefix: str, key: str, *, writable: bool) -> bool:
    """Mount ``key``'s environment at ``prefix`` from the blob and metadata image this
    node already has, without the store. False when it has not (or they changed: the
    store path then checks them)."""
    rec = cached_blob(config, key)
    if rec is None:
        return False
    if unavailable(config) is not None:
        return False   # the restore from the store says why, once
    from bootseer.deps import compat
    compat.check(rec.get("cuda"), compat.driver_version(), f"the environment {key[:19]}")
    blob, meta = rec.get("blob"), rec.get("meta")
    if not (isinstance(blob, str) and isinstance(meta, str)) or \
            not _verified_unchanged(blob) or not _meta_matches(meta):
        return False
    if rec.get("relocated") and not writable:
        return False   # the store path says why and extracts
    place.clear(prefix)
    _mount(prefix, key, rec["tree"], meta, blob, writable=writable,
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
        from bootseer.deps.mounted import mounted_info
        if mounted_info(prefix) is None:   # never the state of a live mount (another key's)
            sweep(prefix)
        raise


def without_privileges(toc: dict) -> dict:
    """The TOC as an environment is restored: no set-id bits, only ``user.*`` xattrs, no
    device nodes or fifos (as an extraction writes it; the mounts are nosuid, nodev)."""
    from bootseer.tree.extract import SETID
    entries = [{**e, "mode": e["mode"] & ~SETID,
                "xattrs": {k: v for k, v in (e.get("xattrs") or {}).items()
                           if k.startswith("user.")}}
               for e in toc["entries"] if e["type"] not in ("c", "b", "p")]
    return {**toc, "entries": entries}


def _fetch_and_mount(config: BootseerConfig, store, manifest: dict, prefix: str, key: str,
                     *, writable: bool, progress) -> None:
    from bootseer.store.client import StoreClient
    from bootseer.tree.blob import BlobLayout, unsupported
    from bootseer.tree.blob_mount import metadata_image
    from bootseer.tree.reader import TreeReader
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
    images = _erofs_dir(config)
    images.mkdir(parents=True, exist_ok=True)
    if kernel.image_fs_problem(str(images)) and kernel.image_fs_problem(str(state)):
        # where metadata_image would write it: checked before fetching anything
        raise KernelMountError(f"no place for the metadata image: "
                               f"{kernel.image_fs_problem(str(state))}")
    client = StoreClient.of(config)
    with client.lane() as f:
        reader = TreeReader(store, tree, f, client.cache)
        why = unsupported(reader.toc)
        if why is not None:
            raise KernelMountError(f"the snapshot's tree cannot be an EROFS image: {why}")
        layout = BlobLayout(reader.toc)
        # the metadata image (pure Python, a second or two for 20k files) is written
        # while the fetch's threads decompress and verify
        made: dict = {}

        def write_meta() -> None:
            try:
                # its own cache entry: the lazy mount of the same tree keeps every bit
                made["meta"] = str(metadata_image(config, f"{tree}:env",
                                                  without_privileges(reader.toc), layout,
                                                  state))
            except BaseException as e:  # noqa: BLE001 - raised in the restoring thread
                made["error"] = e
        writer = threading.Thread(target=write_meta, name="bootseer-erofs-meta")
        writer.start()
        try:
            blob = _local_blob(config, store, reader, layout, key, f, progress,
                               str(env_blob_path(config, layout)))
        finally:
            writer.join()
    if "error" in made:
        e = made["error"]
        if isinstance(e, kernel.ErofsMountError):
            raise KernelMountError(str(e)) from e
        raise e
    _write_json(_index_path(config, key), {"key": key, "tree": tree, "blob": blob,
                                           "meta": made["meta"], "layout": layout.key,
                                           "cuda": manifest.get("cuda"),
                                           "relocated": relocated})
    place.clear(prefix)   # what was there stays until the new environment is local
    _mount(prefix, key, tree, made["meta"], blob, writable=writable, relocated=relocated)


def _local_blob(config: BootseerConfig, store, reader, layout, key: str, fetcher, progress,
                blob: str) -> str:
    """The verified blob at ``blob``: the node's copy when it is still good, else
    fetched."""
    from bootseer.deps.blob_fetch import fetch_blob
    from bootseer.tree.blob import verify_blob
    if os.path.exists(blob) and not _verified_unchanged(blob):
        log.info("verifying the node's blob of %s (changed since it was verified, or "
                 "verified before this boot)", key[:19])
        try:
            verify_blob(layout, blob)
            _write_json(Path(blob + ".verified"), _stamp(blob))
        except (OSError, StoreError) as e:
            log.error("the node's blob of %s fails verification, removed and fetched "
                      "again: %s", key[:19], e)
            Path(blob).unlink(missing_ok=True)
    if not os.path.exists(blob):
        with tracing.phase("deps.fetch") as span:
            from bootseer.peers.whole_tree import fetch_tree   # the job's peers first
            span.set(**(fetch_tree(config, store, reader) or {}))
            total = sum(ref[4] for ref in layout.refs)   # the data, not the padding
            span.set(**fetch_blob(reader, layout, blob,
                                  (lambda n: progress(n, total)) if progress else None),
                     requests=fetcher.counters()["requests"], blob_bytes=layout.size)
        _write_json(Path(blob + ".verified"), _stamp(blob))
    return blob


def _mount(prefix: str, key: str, tree: str, meta: str, blob: str, *, writable: bool,
           relocated: dict | None = None) -> None:
    """Mount at ``prefix`` (made empty by the caller); the sidecar first, so that a
    command killed mid-way leaves a mount recognised as ours. ``relocated`` (a snapshot
    made at another prefix: ``{"from", "text", "links", ...}``): its recorded
    occurrences are rewritten through the overlay, into its upper directory, before the
    mount is complete. A failure unmounts what it mounted."""
    state = state_dir(prefix)
    sweep(prefix, images=False)    # a dead mount's leftovers, not the image just written
    os.makedirs(prefix, exist_ok=True)
    info = {"key": key, "tree": tree, "backend": KERNEL_BACKEND, "writable": writable,
            "blob": blob, "meta": meta, "mount_id": None, "started": time.time(),
            "relocated": relocated}
    _write_json(Path(sidecar(prefix)), info)
    try:
        with tracing.phase("deps.mount", writable=writable):
            if writable:
                lower, upper, work = (os.path.join(state, d) for d in ("lower", "upper", "work"))
                for d in (lower, upper, work):
                    os.makedirs(d, exist_ok=True)
                kernel.mount_with_read_ahead(meta, lower, blob)
                _overlay(prefix, lower, upper, work)
            else:
                kernel.mount_with_read_ahead(meta, prefix, blob)
        if relocated:
            with tracing.phase("deps.relocate") as span:
                span.set(paths=relocate.rewrite(prefix, relocated, relocated["from"], prefix))
    except BaseException:
        unmount(prefix, info)
        raise
    entry = points.find(prefix)
    info["mount_id"] = entry.mount_id if entry is not None else None
    _write_json(Path(sidecar(prefix)), info)
    log.info("%s: EROFS on the local blob at %s%s", key[:19], prefix,
             " under a writable overlay" if writable else " (read-only)")


def _overlay(prefix: str, lower: str, upper: str, work: str) -> None:
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"bootseer-env", prefix.encode(), b"overlay",
                  kernel.MS_NOSUID | kernel.MS_NODEV, opts) != 0:
        e = ctypes.get_errno()
        raise KernelMountError(f"cannot mount the overlay at {prefix}: {os.strerror(e)}")


# -- unmount ---------------------------------------------------------------------------------
def unmount(prefix: str, info: dict | None = None) -> bool:
    """Unmount the environment at ``prefix`` (the overlay, then EROFS beneath it), lazily
    where files are held open (the kernel keeps the filesystems for the open files and
    frees them at the last close); then remove the sidecar and the state it used (the
    overlay's upper and work directories). Returns whether the unmount was immediate.
    A mount at ``prefix`` that is not the one the sidecar names is left alone (error)."""
    immediate = True
    entry = points.find(prefix) if is_mount_point(prefix) else None
    if entry is not None:
        recorded = (info or {}).get("mount_id")
        # no id yet: a command killed between mount(2) and completing the sidecar
        if entry.mount_id != recorded and (recorded is not None or
                                           entry.fstype not in ("erofs", "overlay")):
            raise KernelMountError(f"the mount at {prefix} is not the environment bootseer "
                                   f"mounted there ({entry.fstype}): not unmounting it")
        immediate = kernel.unmount(prefix)
    sweep(prefix)
    Path(sidecar(prefix)).unlink(missing_ok=True)
    if not immediate:
        log.info("%s is in use: detached lazily (freed when the last file closes)", prefix)
    return immediate


def sweep(prefix: str, *, images: bool = True) -> None:
    """Remove what a kernel mount of ``prefix`` kept in its state directory: the EROFS
    lower layer (detached lazily if still in use), the overlay's directories, and (with
    ``images``) a metadata image written there (a node cache on tmpfs cannot hold it)."""
    state = state_dir(prefix)
    lower = os.path.join(state, "lower")
    if is_mount_point(lower):
        kernel.unmount(lower)
    for d in ("upper", "work"):
        place.rmtree(os.path.join(state, d))
    for image in Path(state).glob("*.meta*") if images else ():
        image.unlink(missing_ok=True)   # the kernel holds a mounted one open
    for d in (lower, state):
        try:
            os.rmdir(d)
        except OSError:
            pass   # absent, or holds what a lazy mount (--mount) keeps there


def cached_blob(config: BootseerConfig, key: str) -> dict | None:
    """The node's record of ``key``'s blob (``{"blob", "meta", ...}``), if it has one."""
    try:
        rec = json.loads(_index_path(config, key).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("blob"), str) else None


def blob_bytes(info: dict) -> int:
    try:
        return os.stat(info["blob"]).st_size
    except (OSError, KeyError, TypeError):
        return 0


def drop_blob(config: BootseerConfig, key: str, info: dict) -> None:
    """Forget ``key``'s blob on this node (``deps gc``): its index entry, and the file
    with its verification stamp unless another key's entry names it too (the same tree
    restored at two prefixes); a mount still using the file keeps it until unmounted."""
    mine = _index_path(config, key)
    mine.unlink(missing_ok=True)
    blob = info.get("blob")
    if not blob:
        return
    for other in mine.parent.glob("env-*.json"):
        try:
            if json.loads(other.read_text()).get("blob") == blob:
                return
        except (OSError, ValueError):
            continue
    for p in (blob, blob + ".verified"):
        Path(p).unlink(missing_ok=True)
