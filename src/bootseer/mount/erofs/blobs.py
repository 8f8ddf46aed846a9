"""Lazy trees' complete blobs on the node, kept as an LRU: ``<cache>/erofs/trees/<layout
key>.blob``, re-verified chunk by chunk before each mount. Every chunk of a tree already
in the node cache is first assembled into that file (through a part its writer locks,
:mod:`bootseer.node.partfile`: the part a killed assembly leaves is removed by the next
mount on the node). Restored environments keep their blobs apart, in ``<cache>/erofs``,
owned and removed by ``deps gc`` alone, whether mounted or not: this LRU never sees them.

A blob doubles the bytes of its chunks on disk, so blobs are made only where half the
node cache's budget allows, and the least recently mounted go first, never one a live
mount holds (a shared lock on it)."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import Protocol

from bootseer.errors import StoreError
from bootseer.node import partfile

log = logging.getLogger(__name__)


class BlobSource(Protocol):
    """A tree's blob as the technique knows it: its layout's key and size, how to check
    a file holds it, and how to make it from the node cache."""

    key: str
    size: int

    def verify(self, path: str) -> None: ...

    def all_local(self) -> bool: ...

    def assemble(self, dest: str) -> None: ...


def blob_path(cache_dir: str, key: str) -> Path:
    return Path(cache_dir) / "erofs" / "trees" / f"{key}.blob"


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


def local_blob(cache_dir: str, budget_bytes: int, blob: BlobSource) -> tuple[str, int] | None:
    """The complete blob as a verified local file, when it is or can be made so, held
    (:func:`_hold`: the caller closes the descriptor when its mount is gone)."""
    path = blob_path(cache_dir, blob.key)
    partfile.sweep_dead(path.parent)   # what killed assemblies left (any tree's)
    held = _hold(path)
    if held is not None:
        try:
            blob.verify(str(path))
            os.utime(path)   # LRU clock among local blobs
            return str(path), held
        except (OSError, StoreError) as e:
            log.error("local blob %s fails verification, removed: %s", path, e)
            path.unlink(missing_ok=True)
            os.close(held)
    share = budget_bytes // 2
    if blob.size > share or not blob.all_local():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    _make_room(path.parent, share - blob.size)
    try:
        blob.assemble(str(path))
    except (OSError, StoreError) as e:
        log.info("blob of %d bytes not assembled (%s): served by FUSE", blob.size, e)
        return None
    held = _hold(path)   # None: another node process made room meanwhile
    if held is None:
        return None
    log.info("assembled the complete blob %s (%d bytes)", path.name, blob.size)
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
