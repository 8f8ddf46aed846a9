"""The node's cache of EROFS metadata images: one per tree and blob layout, in
``<cache dir>/erofs`` on local disk (the kernel reads it in 4 KiB pieces), with its
sha256 beside it, checked before each mount. Writing one costs some tens of
microseconds per file and a node mounts the same tree again and again; a copy that no
longer matches its sum is written anew. A cache on tmpfs cannot hold it (the kernel
mounts no image from there): then the mount's state directory does, written per mount.

What goes into an image is the technique's business (``build``); this module only keeps
images."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from bootseer.mount.erofs import kernel
from bootseer.node import partfile

log = logging.getLogger(__name__)
META_FORMAT = b"bootseer.erofs-meta.v1"


def images_dir(cache_dir: str) -> Path:
    return Path(cache_dir) / "erofs"


def metadata_image(cache_dir: str, name: str, layout_key: str, state: Path,
                   build: Callable[[], bytes]) -> Path:
    """The metadata image of tree ``name`` in the blob layout ``layout_key``: the cached
    one when it still matches its sum, else ``build()`` written into the cache (or into
    ``state`` where the cache is on a filesystem EROFS cannot mount images from)."""
    d = images_dir(cache_dir)
    d.mkdir(parents=True, exist_ok=True)
    if kernel.image_fs_problem(str(d)) is not None:
        why = kernel.image_fs_problem(str(state))
        if why is not None:
            raise kernel.ErofsMountError(f"no place for the metadata image: {why}")
        d = state
    key = hashlib.sha256(b"%s\0%s\0%s" % (META_FORMAT, name.encode(),
                                             layout_key.encode())).hexdigest()
    path, sums = d / f"{key}.meta", d / f"{key}.meta.sha256"
    try:
        if hashlib.sha256(path.read_bytes()).hexdigest() == sums.read_text().strip():
            os.utime(path)
            return path
        log.warning("metadata image %s does not match its sum: written anew", path)
    except FileNotFoundError:
        pass
    image = build()
    partfile.sweep_dead(d)   # images a killed writer left half written
    partfile.write_atomic(sums, hashlib.sha256(image).hexdigest().encode())
    partfile.write_atomic(path, image)
    return path


def matches(meta: str) -> bool:
    """The metadata image still hashes to the sum written beside it."""
    try:
        want = Path(meta + ".sha256").read_text().strip()
        return hashlib.sha256(Path(meta).read_bytes()).hexdigest() == want
    except OSError:
        return False


def place_problem(cache_dir: str, state: str) -> str | None:
    """Why no metadata image could be written for a mount with state directory
    ``state`` (None: one can), asked before anything is fetched."""
    d = images_dir(cache_dir)
    d.mkdir(parents=True, exist_ok=True)
    if kernel.image_fs_problem(str(d)) and kernel.image_fs_problem(state):
        return f"no place for the metadata image: {kernel.image_fs_problem(state)}"
    return None
