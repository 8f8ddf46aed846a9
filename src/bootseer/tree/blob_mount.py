"""A lazy tree mounted by the kernel: EROFS on a metadata image written from the TOC, with
the data blob as its device.

* The blob is complete on the node (``<cache>/erofs/trees/<layout key>.blob``, re-verified
  chunk by chunk before each mount): EROFS mounts it directly, no Python serves reads.
  Every chunk of a tree already in the node cache is first assembled into that file
  (through a part its writer locks, :mod:`bootseer.node.partfile`: the part a killed assembly
  leaves is removed by the next mount on the node).
* Otherwise a single-file FUSE server (the tree session: demand reads through the
  fetcher and node cache, verified, recorded, hot chunks prefetched) serves the blob,
  and EROFS mounts the blob file on that FUSE mount, reading it with O_DIRECT
  (``directio``): the server sees only the range reads EROFS makes for files, in the
  sizes it makes them; no read-ahead of the blob runs into other files' chunks (which
  would fetch and record what the job never reads), and the data is cached once, in
  EROFS's page cache. As the prefetch makes each hot chunk local, it is read through the
  EROFS file that holds it (bootseer.tree.preread), so that page cache holds it before the
  job reads it.

The metadata image (about 100 bytes per file plus directories) is written once per tree
and blob layout into ``<cache>/erofs`` on local disk (the kernel reads it in 4 KiB
pieces), checked against its sha256 before each mount.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from bootseer.node import alive
from bootseer.node import partfile
from bootseer.config import BootseerConfig
from bootseer.errors import StoreError
from bootseer.mount.erofs import kernel
from bootseer.mount.erofs.writer import write_image
from bootseer.store.client import StoreClient
from bootseer.tree.blob import (BLOB_NAME, BlobLayout, BlobView, all_local, assemble,
                                erofs_root, verify_blob)
from bootseer.tree.preread import hot_ranges, preread

log = logging.getLogger(__name__)
PREREAD = "preread"           # created in the state dir once the hot head was pre-read
FRESH_BYTES = 64 << 20        # prefetched hot chunks kept in memory until pre-read


class _NoServer:
    """Stands for the server process of a mount that has none (EROFS on a local blob):
    alive while mounted, so callers that watch the server watch the mount."""

    pid = None

    def __init__(self, mountpoint: str):
        self.mountpoint = mountpoint

    def is_alive(self) -> bool:
        return os.path.ismount(self.mountpoint)

    def join(self, timeout: float | None = None) -> None:
        pass

    def kill(self) -> None:
        pass


class ErofsTreeHandle:
    """A mounted tree on the kernel path; the same surface as the FUSE MountHandle."""

    def __init__(self, mountpoint: str, server=None, backend: str = "erofs",
                 blob_hold: int | None = None):
        self.mountpoint, self.server, self.backend = mountpoint, server, backend
        self._blob_hold = blob_hold   # the local blob's shared lock (see _make_room)
        # no server dies with us: a SIGKILLed owner's kernel mount is undone by the next
        # command on the node (bootseer.node.alive)
        self._note: alive.StateDir | None = alive.note_mount(mountpoint)
        self.proc = server.proc if server is not None else _NoServer(mountpoint)
        self._stop = threading.Event()

    @property
    def pid(self):
        return self.proc.pid

    def unmount(self, timeout: float = 20) -> None:
        """Idempotent. Files still open keep a lazily detached EROFS alive; its blob
        server then gets a short grace and is stopped, so nothing outlives the caller
        (reads of data not yet in the page cache fail with EIO from then on)."""
        self._stop.set()
        immediate = True
        if os.path.ismount(self.mountpoint):
            immediate = kernel.unmount(self.mountpoint)
            if not immediate:
                log.info("%s is busy: detached lazily", self.mountpoint)
        if self.server is not None:
            self.server.unmount(timeout=timeout if immediate else 2)
        if self._blob_hold is not None:
            os.close(self._blob_hold)
            self._blob_hold = None
        if self._note is not None:
            self._note.close()
            self._note = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unmount()


def local_blob_path(config: BootseerConfig, layout: BlobLayout) -> Path:
    """Lazy trees' blobs have a directory of their own, the only one their LRU removes
    from: restored environments keep theirs in ``<cache>/erofs`` (deps.kernel_restore),
    owned and removed by ``deps gc`` alone, whether mounted or not."""
    return Path(config.cache.dir) / "erofs" / "trees" / f"{layout.key}.blob"


def _hold(path: Path) -> int | None:
    """A descriptor of ``path`` with a shared lock on it, kept while a mount uses the
    blob: ``_make_room`` removes no blob that one holds. None when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:   # removed while we waited for the lock: not the file at path any more
        st, held = os.stat(path), os.fstat(fd)
        if (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino):
            return fd
    except FileNotFoundError:
        pass
    os.close(fd)
    return None


def _local_blob(config: BootseerConfig, layout: BlobLayout) -> tuple[str, int] | None:
    """The complete blob as a verified local file, when it is or can be made so, held
    (:func:`_hold`: the caller closes the descriptor when its mount is gone)."""
    path = local_blob_path(config, layout)
    partfile.sweep_dead(path.parent)   # what killed assemblies left (any tree's)
    held = _hold(path)
    if held is not None:
        try:
            verify_blob(layout, str(path))
            os.utime(path)   # LRU clock among local blobs
            return str(path), held
        except (OSError, StoreError) as e:
            log.error("local blob %s fails verification, removed: %s", path, e)
            path.unlink(missing_ok=True)
            os.close(held)
    cache = StoreClient.of(config).cache
    # a blob doubles the bytes of its chunks on disk: only where half the budget allows
    share = config.cache.budget_bytes // 2
    if layout.size > share or not all_local(layout, cache):
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    _make_room(path.parent, share - layout.size)
    try:
        assemble(layout, cache, str(path))
    except (OSError, StoreError) as e:
        log.info("blob of %d bytes not assembled (%s): served by FUSE", layout.size, e)
        return None
    held = _hold(path)   # None: another node process made room meanwhile
    if held is None:
        return None
    log.info("assembled the complete blob %s (%d bytes)", path.name, layout.size)
    return str(path), held


def _make_room(directory: Path, allowed: int) -> None:
    """Remove the least recently mounted blobs until the rest fit ``allowed`` bytes,
    never one a live mount holds (a shared lock, :func:`_hold`): the kernel would keep
    reading it, its bytes still on disk, and a remount would make it again."""
    blobs = []
    for p in directory.glob("*.blob"):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        blobs.append((st.st_mtime, st.st_size, p))
    blobs.sort()
    used = sum(size for _, size, _ in blobs)
    for _, size, p in blobs:
        if used <= allowed:
            break
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            used -= size
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue   # a live mount's
        else:
            p.unlink(missing_ok=True)
            used -= size
        finally:
            os.close(fd)


META_FORMAT = b"bootseer.erofs-meta.v1"


def metadata_image(config: BootseerConfig, tree: str, toc: dict, layout: BlobLayout,
                   state: Path) -> Path:
    """The tree's metadata image for this blob layout, kept in ``<cache dir>/erofs`` with
    its sha256 beside it (writing one costs some tens of microseconds per file; a node
    mounts the same tree again and again). A copy that no longer matches its sum is
    written anew. A cache on tmpfs cannot hold it (the kernel mounts no image from
    there): then the mount's state directory does, written per mount."""
    d = Path(config.cache.dir) / "erofs"
    d.mkdir(parents=True, exist_ok=True)
    if kernel.image_fs_problem(str(d)) is not None:
        why = kernel.image_fs_problem(str(state))
        if why is not None:
            raise kernel.ErofsMountError(f"no place for the metadata image: {why}")
        d = state
    key = hashlib.sha256(b"%s\0%s\0%s" % (META_FORMAT, tree.encode(),
                                             layout.key.encode())).hexdigest()
    path, sums = d / f"{key}.meta", d / f"{key}.meta.sha256"
    try:
        if hashlib.sha256(path.read_bytes()).hexdigest() == sums.read_text().strip():
            os.utime(path)
            return path
        log.warning("metadata image %s does not match its sum: written anew", path)
    except FileNotFoundError:
        pass
    root, skipped = erofs_root(toc, layout)
    image, stats = write_image(root, chunk_size=layout.chunk_size, blob_blocks=layout.blocks,
                               tag=layout.key.encode())
    if stats.skipped_xattrs or skipped["hardlinks_to_missing"]:
        log.warning("tree %s: %d xattrs outside EROFS's namespaces and %d dangling hard "
                    "links are not in the image", tree[:19], stats.skipped_xattrs,
                    skipped["hardlinks_to_missing"])
    partfile.sweep_dead(d)   # images a killed writer left half written
    partfile.write_atomic(sums, hashlib.sha256(image).hexdigest().encode())
    partfile.write_atomic(path, image)
    return path


def blob_server_view(config: BootseerConfig, tree: str, state_dir: str, record: bool,
                     profile: dict | None, window_timeout_s: float, hot: list[str],
                     key: str) -> BlobView:
    """Runs in the blob's FUSE server process: the tree session behind a one-file view."""
    from bootseer.tree.session import TreeSession
    s = TreeSession(config, tree, state_dir, record=record, profile=profile,
                    window_timeout_s=window_timeout_s)
    layout = BlobLayout(s.reader.toc, hot)
    if layout.key != key:
        raise ValueError(f"blob layout {layout.key[:12]} differs from the image's {key[:12]}")
    # the pre-read follows the prefetch closely: hot chunks wait for it in memory
    s.reader.keep_fresh(hot, FRESH_BYTES)
    return BlobView(s.reader, layout, on_close=s.finish)


def _unmount_once_started(starting: Future) -> None:
    try:
        server = starting.result()
    except Exception:  # noqa: BLE001 - the error that ends the mount is the caller's
        return
    server.unmount()


def mount_tree_erofs(config: BootseerConfig, tree: str, toc: dict, profile: dict | None,
                     mountpoint: str, state_dir: str, *, record: bool = True,
                     window_timeout_s: float = 600.0,
                     name: str = "bootseer-tree") -> ErofsTreeHandle:
    from bootseer.mount.fuse import MountError, mount
    from bootseer.tree.session import PREFETCHED
    if not os.path.isdir(mountpoint):
        raise MountError(f"mount point {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        raise MountError(f"{mountpoint} is already a mount point")
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    hot = [row[0] for row in profile["chunks"]] if profile else []
    layout = BlobLayout(toc, hot)

    found = _local_blob(config, layout)
    if found is not None:
        local, held = found
        try:
            meta = metadata_image(config, tree, toc, layout, state)
            kernel.mount_with_read_ahead(str(meta), mountpoint, local)
        except BaseException:
            os.close(held)
            raise
        handle = ErofsTreeHandle(mountpoint, None, backend="erofs-local",   # noted at once
                                 blob_hold=held)
        # no Python sees the reads: nothing to record, nothing to prefetch
        partfile.write_atomic(state / "figures.json", json.dumps({
            "tree": tree, "backend": "erofs-local", "window_s": 0.0, "closed_by": "local blob",
            "read_chunks": 0, "read_bytes": 0, "coverage": 1.0, "precision": None,
            "stall_s": 0.0, "demand_chunks": 0, "store_bytes": 0, "store_requests": 0,
            "prefetch": None}).encode())
        for marker in (PREFETCHED, PREREAD):
            (state / marker).touch()
        log.info("%s: EROFS on the local blob at %s", tree[:19], mountpoint)
        return handle

    blob_mp = state / "blobfs"
    blob_mp.mkdir(exist_ok=True)
    factory = functools.partial(blob_server_view, config, tree, str(state), record, profile,
                                window_timeout_s, hot, layout.key)
    # The blob server starts (a process of its own: imports, the TOC, the session; about
    # 0.5 s here) while this one writes the metadata image (about 0.3 s for bench/image's
    # 25k files on a fresh node): both are on the path to the job's start, and a node
    # with a free core does them at once (on this loaded 2-core machine, back to back,
    # mount_tree took 1.0-1.5 s either way).
    # EROFS reads the blob with O_DIRECT, so the blob mount's own read-ahead never runs.
    with ThreadPoolExecutor(1, thread_name_prefix="bootseer-blob-server") as pool:
        starting = pool.submit(mount, factory, str(blob_mp), name=f"{name}-blob-{tree[7:19]}",
                               read_ahead_kb=0)
        try:
            meta = metadata_image(config, tree, toc, layout, state)
        except BaseException:
            _unmount_once_started(starting)
            raise
        server = starting.result()
    try:
        kernel.mount_with_read_ahead(str(meta), mountpoint, str(blob_mp / BLOB_NAME),
                                     directio=True)
    except BaseException:
        server.unmount()
        raise
    handle = ErofsTreeHandle(mountpoint, server, backend="erofs-fuse-blob")
    # the hot chunks into the page cache, each as soon as the prefetch made it local
    is_local = StoreClient.of(config).cache.contains
    threading.Thread(target=preread, daemon=True, name="bootseer-preread",
                     args=(os.path.abspath(mountpoint), hot_ranges(layout), is_local,
                           state / PREFETCHED, state / PREREAD, handle._stop)).start()
    log.info("%s: EROFS at %s on the FUSE-served blob (%d bytes, hot head %d)", tree[:19],
             mountpoint, layout.size, layout.hot_bytes)
    return handle
