"""Serving what a technique describes, as :mod:`bootseer.mount.choose` says: a tree
(EROFS on a local blob, EROFS on a FUSE-served blob, or the FUSE tree view), a file set
(devfuse with passthrough, or mfusepy), or a restored environment's image on its local
blob (EROFS, under a writable overlay or alone). Techniques hand over a description; this module
makes the mounts and returns the one :class:`~bootseer.mount.handle.MountHandle`.

On the kernel path, a tree's blob is either complete on the node (the blob LRU,
:mod:`bootseer.mount.erofs.blobs`): EROFS mounts it directly and no Python serves reads;
or a single-file FUSE server (the technique's ``blob_view``) serves it, and EROFS mounts
the blob file on that FUSE mount reading it with O_DIRECT (``directio``): the server sees
only the range reads EROFS makes for files, in the sizes it makes them; no read-ahead of
the blob runs into other files' chunks, and the data is cached once, in EROFS's page
cache. The metadata image comes from the node's cache (:mod:`bootseer.mount.erofs.images`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bootseer.config import BootseerConfig
from bootseer.errors import MountError
from bootseer.mount import fuse
from bootseer.mount.choose import Serving, What, choose
from bootseer.mount.devfuse import process as devfuse
from bootseer.mount.erofs import BLOB_NAME, kernel
from bootseer.mount.erofs.blobs import BlobSource, local_blob
from bootseer.mount.erofs.images import metadata_image
from bootseer.mount.handle import MountHandle
from bootseer.mount.overlay import mount_overlay
from bootseer.mount.view import TreeView
from bootseer.node import alive, mounts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ErofsTree:
    """A tree on the kernel path, as its technique describes it."""

    name: str
    """The tree, as the metadata image cache names it."""
    blob: BlobSource
    image: Callable[[], bytes]
    """The metadata image, written when the cache has none."""
    blob_view: Callable[[], TreeView]
    """The single-file view (``/blob``) a FUSE server serves the blob from (pickles)."""
    blob_server: str
    """That server's mount name."""
    on_local: Callable[[Path], None]
    """Called with the mount's state directory once EROFS on the local blob is up (no
    Python sees its reads)."""
    on_fuse_blob: Callable[[MountHandle, Path], None]
    """Called with the handle and state directory once EROFS on the FUSE-served blob is
    up."""
    check_server: Callable[[Path], None] | None = None
    """Called with the state directory once a blob server started early
    (:func:`start_blob_server`) is up, before EROFS mounts on it: raises when it serves
    another layout than the metadata image's."""


@dataclass(frozen=True)
class Tree:
    """A tree to serve: its FUSE view, and how to describe it for the kernel path."""

    label: str
    """Short name for log lines."""
    name: str
    """The FUSE mount's name (its fsname)."""
    view: Callable[[], TreeView]
    """The FUSE tree view (pickles: built in the server's process)."""
    erofs: Callable[[], ErofsTree | str]
    """The kernel path's description, or why this tree cannot be an EROFS image."""
    early_blob: Future[MountHandle] | None = None
    """The kernel path's blob server, started before the tree was described
    (:func:`start_blob_server`): used when the blob is not local, else stopped."""


def serve_tree(config: BootseerConfig, tree: Tree, mountpoint: str,
               state_dir: str) -> MountHandle:
    """Serve ``tree`` at ``mountpoint`` (``state_dir``: the mount's own directory)."""
    early = tree.early_blob
    try:
        if choose(config, What.TREE) is Serving.EROFS_FUSE_BLOB:
            described = tree.erofs()
            why = described if isinstance(described, str) else None
            if not isinstance(described, str):
                try:
                    # the early server is _serve_erofs's from here (used or stopped)
                    early, taken = None, early
                    return _serve_erofs(config, described, mountpoint, Path(state_dir), taken)
                except kernel.ErofsMountError as e:   # nothing of it is left mounted
                    if config.mount.backend == "erofs":
                        raise
                    why = str(e)
            log.warning("tree %s is served by the FUSE tree view: %s", tree.label, why)
    finally:
        if early is not None:
            stop_blob_server(early)
    return fuse.mount(tree.view, mountpoint, name=tree.name, serving=Serving.FUSE_VIEW,
                      read_ahead_kb=kernel.START_READ_AHEAD_KB)


BLOB_MOUNT = "blobfs"
"""The blob server's mount point, in the tree mount's state directory."""


def start_blob_server(blob_view: Callable[[], TreeView], state_dir: str,
                      name: str) -> Future[MountHandle]:
    """Start the kernel path's blob server (at ``<state_dir>/blobfs``) in the background,
    before the caller has loaded what describes the tree: its process spawns, imports and
    loads the TOC on a core of its own while the caller loads the same TOC, instead of
    after it. :func:`serve_tree` uses it, or stops it where the blob proves local or the
    tree is not served on the kernel path."""
    blob_mp = Path(state_dir) / BLOB_MOUNT
    blob_mp.mkdir(parents=True, exist_ok=True)
    pool = ThreadPoolExecutor(1, thread_name_prefix="bootseer-blob-server")
    try:
        return pool.submit(fuse.mount, blob_view, str(blob_mp), name=name, read_ahead_kb=0)
    finally:
        pool.shutdown(wait=False)


UNUSED = "blob-server-unused"
"""Made in the state directory before an early blob server no mount uses is stopped: its
session then writes no figures or profile there (the mount that serves the tree does)."""


def stop_blob_server(starting: Future[MountHandle]) -> threading.Thread:
    """Stop a blob server :func:`start_blob_server` started that no mount uses: in a
    thread of its own (returned), which waits for the start to end (the interpreter's
    exit waits for it, so nothing is left mounted) and unmounts what it mounted."""
    stopping = threading.Thread(target=_stop_unused, args=(starting,),
                                name="bootseer-blob-server-stop")
    stopping.start()
    return stopping


def _stop_unused(starting: Future[MountHandle]) -> None:
    try:
        server = starting.result()
    except Exception:  # noqa: BLE001 - it never served: nothing to stop
        return
    try:
        (Path(server.mountpoint).parent / UNUSED).touch()
    except OSError:
        pass   # the state directory is gone: nothing is written there either
    server.unmount()


def serve_image(image: str, blob: str, target: str, *, overlay_in: str | None = None,
                directio: bool = False) -> None:
    """EROFS of the metadata ``image`` on the local ``blob`` at ``target``, made to outlive
    this process (a restored environment: its owner records it and undoes it with
    :func:`bootseer.node.mounts.unmount`). ``overlay_in``: a directory for a writable
    overlay: EROFS at ``<dir>/lower``, the overlay's ``upper`` and ``work`` beside it, the
    overlay at ``target``. ``directio``: a FUSE-served blob, read with O_DIRECT. A
    failure leaves nothing mounted."""
    if overlay_in is None:
        kernel.mount_with_read_ahead(image, target, blob, directio=directio)
        return
    lower, upper, work = (os.path.join(overlay_in, d) for d in ("lower", "upper", "work"))
    for d in (lower, upper, work):
        os.makedirs(d, exist_ok=True)
    kernel.mount_with_read_ahead(image, lower, blob, directio=directio)
    try:
        mount_overlay(target, lower, upper, work)
    except BaseException:
        mounts.unmount(lower)
        raise


def serve_files(config: BootseerConfig, view_factory: Callable[[], TreeView],
                mountpoint: str, *, name: str) -> MountHandle:
    """Serve a file set (a remote checkpoint directory) at ``mountpoint``: devfuse, whose
    staged files the kernel reads through passthrough, or mfusepy."""
    if choose(config, What.FILES) is Serving.DEVFUSE:
        return devfuse.mount(view_factory, mountpoint, name=name)
    return fuse.mount(view_factory, mountpoint, name=name)


def _unmount_once_started(starting: Future) -> None:
    try:
        server = starting.result()
    except Exception:  # noqa: BLE001 - the error that ends the mount is the caller's
        return
    server.unmount()


def _serve_erofs(config: BootseerConfig, tree: ErofsTree, mountpoint: str,
                 state: Path, early: Future[MountHandle] | None = None) -> MountHandle:
    """EROFS of ``tree`` at ``mountpoint``; ``early``: its blob server, if started
    already (stopped here unless a mount uses it)."""
    try:
        return _erofs_mount(config, tree, mountpoint, state, early)
    except BaseException:
        if early is not None:
            stop_blob_server(early)   # a no-op unmount once the mount has taken it
        raise


def _erofs_mount(config: BootseerConfig, tree: ErofsTree, mountpoint: str,
                 state: Path, early: Future[MountHandle] | None) -> MountHandle:
    if not os.path.isdir(mountpoint):
        raise MountError(f"mount point {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        raise MountError(f"{mountpoint} is already a mount point")
    state.mkdir(parents=True, exist_ok=True)

    def image() -> Path:
        return metadata_image(config.cache.dir, tree.name, tree.blob.key, state, tree.image)

    found = local_blob(config.cache.dir, config.cache.budget_bytes, tree.blob)
    if found is not None:
        local, held = found
        try:
            kernel.mount_with_read_ahead(str(image()), mountpoint, local)
        except BaseException:
            os.close(held)
            raise
        # no server dies with us: a SIGKILLed owner's kernel mount is undone by the next
        # command on the node (noted at once)
        handle = MountHandle(mountpoint, Serving.EROFS_LOCAL,
                             state=alive.note_mount(mountpoint), hold=held)
        if early is not None:   # gone by the time this mount is unmounted
            handle.after.append(stop_blob_server(early))
        tree.on_local(state)
        log.info("%s: EROFS on the local blob at %s", tree.name[:19], mountpoint)
        return handle

    blob_mp = state / BLOB_MOUNT
    # The blob server starts (a process of its own: imports, the TOC, the session) while
    # this one fetches the metadata image, unless it started before the TOC was loaded
    # here: both are on the path to the job's start, and a node with a free core does
    # them at once. EROFS reads the blob with O_DIRECT, so the blob mount's own
    # read-ahead never runs.
    starting = early if early is not None else start_blob_server(
        tree.blob_view, str(state), tree.blob_server)
    try:
        meta = image()
    except BaseException:
        _unmount_once_started(starting)
        raise
    server = starting.result()
    try:
        if early is not None and tree.check_server is not None:
            tree.check_server(state)
        kernel.mount_with_read_ahead(str(meta), mountpoint, str(blob_mp / BLOB_NAME),
                                     directio=True, read_ahead_kb=kernel.START_READ_AHEAD_KB)
    except BaseException:
        server.unmount()
        raise
    handle = MountHandle(mountpoint, Serving.EROFS_FUSE_BLOB,
                         state=alive.note_mount(mountpoint), below=server)
    tree.on_fuse_blob(handle, state)
    return handle
