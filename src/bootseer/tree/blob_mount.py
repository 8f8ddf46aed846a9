"""A lazy tree on the kernel path, as the tree describes it to the serving seam
(:mod:`bootseer.mount.serve`, which chooses, mounts and unmounts):

* the metadata image (about 100 bytes per file plus directories), made when the tree was
  built and fetched by the digest its TOC names, else written here
  (:mod:`bootseer.tree.meta_image`);
* the data blob's layout, how a local copy is checked chunk by chunk and how it is
  assembled from the node cache;
* the single-file view a FUSE server serves the blob from when it is not local (the tree
  session: demand reads through the fetcher and node cache, verified, recorded, hot
  chunks prefetched; built by the caller, :mod:`bootseer.tree.session`);
* what follows each mount. On the local blob no Python sees a read: nothing to record or
  prefetch, the start's figures say so. On the FUSE-served blob, as the prefetch makes
  each hot chunk local it is read through the EROFS file that holds it
  (:mod:`bootseer.tree.preread`), so EROFS's page cache holds it before the job reads it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from bootseer.config import BootseerConfig
from bootseer.mount.erofs.blobs import blob_path
from bootseer.mount.handle import MountHandle
from bootseer.mount.serve import ErofsTree
from bootseer.mount.view import TreeView
from bootseer.node import partfile
from bootseer.store.cache import NodeCache
from bootseer.store.client import StoreClient
from bootseer.tree import meta_image
from bootseer.tree.blob import BlobLayout, all_local, assemble, verify_blob
from bootseer.tree.preread import HOTPACK, PREFETCHED, hot_ranges, preread
from bootseer.tree.toc import Toc

log = logging.getLogger(__name__)
PREREAD = "preread"           # created in the state dir once the hot chunks were pre-read
FRESH_BYTES = 64 << 20        # prefetched hot chunks kept in memory until pre-read
SERVED_LAYOUT = "blob-layout"
"""In the state dir: the layout key of the blob a server started early serves."""


class LocalBlob:
    """The tree's blob as the blob LRU sees it (:class:`bootseer.mount.erofs.blobs.BlobSource`)."""

    def __init__(self, config: BootseerConfig, layout: BlobLayout):
        self.layout, self.key, self.size = layout, layout.key, layout.size
        self._config = config

    @property
    def cache(self) -> NodeCache:
        return StoreClient.of(self._config).cache

    def verify(self, path: str) -> None:
        verify_blob(self.layout, path)

    def all_local(self) -> bool:
        return all_local(self.layout, self.cache)

    def assemble(self, dest: str) -> None:
        assemble(self.layout, self.cache, dest)


def erofs_tree(config: BootseerConfig, tree: str, toc: Toc, layout: BlobLayout,
               hot: list[str], blob_view: Callable[[], TreeView],
               blob_server: str, profile: dict | None = None) -> ErofsTree:
    """The kernel path's description of ``tree`` (``hot``: the profile's chunks in its
    order, ``profile``: the hot set, whose read blocks the pre-read follows;
    ``blob_view``: the blob server's view factory, ``blob_server`` its mount's name). Its
    metadata image is the one stored with the tree, fetched while the blob server starts,
    or written here when there is none to use."""
    return ErofsTree(
        name=tree, blob=LocalBlob(config, layout),
        image=lambda: meta_image.image(config, tree, toc, layout, "tree"),
        blob_view=blob_view, blob_server=blob_server,
        on_local=lambda state: _on_local_blob(config, tree, layout.key, state),
        on_fuse_blob=lambda handle, state: _on_fuse_blob(config, layout, hot, handle, state,
                                                         profile),
        check_server=lambda state: _check_served_layout(state, layout.key))


def served_layout(state_dir: str, key: str) -> None:
    """In a blob server started before its mount loaded the TOC: the layout it serves,
    for the mount to check against its metadata image's (``_check_served_layout``)."""
    partfile.write_atomic(Path(state_dir) / SERVED_LAYOUT, key.encode())


def _check_served_layout(state: Path, key: str) -> None:
    try:
        served = (state / SERVED_LAYOUT).read_text()
    except FileNotFoundError:
        served = "none"
    if served != key:
        raise ValueError(f"the blob server serves layout {served[:12]}, the metadata image "
                         f"is of {key[:12]}")


def _local_hint(config: BootseerConfig, tree: str) -> Path:
    """``<cache>/erofs/local/<tree>``: the layout key of the blob the tree's last mount
    here found local."""
    return blob_path(config.cache.dir, "x").parent.parent / "local" / tree.removeprefix("sha256:")


def was_local(config: BootseerConfig, tree: str) -> bool:
    """Whether the last mount of ``tree`` on this node found its blob local, and that
    blob is still there (a hint: the mount checks the blob itself)."""
    try:
        key = _local_hint(config, tree).read_text()
    except OSError:
        return False
    return blob_path(config.cache.dir, key).exists()


def _note_local(config: BootseerConfig, tree: str, key: str) -> None:
    hint = _local_hint(config, tree)
    try:
        hint.parent.mkdir(exist_ok=True)
        partfile.write_atomic(hint, key.encode())
    except OSError as e:   # a hint only: the next mount starts its blob server early
        log.info("cannot note the local blob of %s: %s", tree[:19], e)


def _on_local_blob(config: BootseerConfig, tree: str, key: str, state: Path) -> None:
    _note_local(config, tree, key)
    partfile.write_atomic(state / "figures.json", json.dumps({
        "tree": tree, "backend": "erofs-local", "window_s": 0.0, "closed_by": "local blob",
        "read_chunks": 0, "read_bytes": 0, "read_block_bytes": 0,
        "coverage": 1.0, "precision": None,
        "stall_s": 0.0, "demand_chunks": 0, "store_bytes": 0, "store_requests": 0,
        "prefetch": None}).encode())
    for marker in (PREFETCHED, PREREAD):
        (state / marker).touch()


def _on_fuse_blob(config: BootseerConfig, layout: BlobLayout, hot: list[str],
                  handle: MountHandle, state: Path, profile: dict | None = None) -> None:
    """The hot ranges into the page cache, each as soon as the prefetch made its chunk
    (or the hot pack its blocks) local."""
    is_local = StoreClient.of(config).cache.contains
    ranges = hot_ranges(layout, hot, profile)
    threading.Thread(target=preread, daemon=True, name="bootseer-preread",
                     args=(os.path.abspath(handle.mountpoint), ranges, is_local,
                           state / PREFETCHED, state / PREREAD, handle.stopped, 600.0,
                           state / HOTPACK)).start()
    log.info("EROFS at %s on the FUSE-served blob (%d bytes; %d hot ranges, %d bytes)",
             handle.mountpoint, layout.size, len(ranges), sum(r.length for r in ranges))
