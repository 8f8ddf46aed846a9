"""Environments' blobs on this node: a snapshot's whole data blob as one file, which a
restore mounts instead of extracting (``restore``), and the node's record of which blob
and metadata image serve a key, so a node with them mounts without asking the store.

- ``<cache>/erofs/<layout>.blob``: the blob; ``deps gc`` is the only one to remove it (lazy
  images keep theirs apart, in ``erofs/trees``, and make room among those only:
  ``bootseer.mount.erofs.blobs``).
- ``<blob>.verified``: the size, inode, mtime, ctime and boot the blob had when it was last
  verified chunk by chunk (any write changes the ctime). One unchanged is mounted at once,
  in the boot that verified it: a crash can leave a renamed blob whose data never reached
  the disk (it is written without fsync), so after a reboot every blob is re-verified
  once. A blob that fails is removed and fetched again.
- ``<cache>/erofs/env-<key>.json``: the key's blob, metadata image and tree.

A fetch queues every chunk not in the node cache at once (the fetcher coalesces
neighbours in a pack into few large requests); chunks are decompressed and verified on a
few threads in blob order and written at their slots as they arrive (the tree's one
chunk writer, ``tree.writer.ChunkWriter``), so a chunk's bytes are held only until written
and nothing is written twice: the blob is the node's copy of the environment, its chunks
are not also put in the node cache. It is written to a part beside its final name, locked
by its writer (``bootseer.node.partfile``), then renamed: a killed fetch leaves no blob
that looks whole, and the next fetch on the node removes every part a dead process left.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from bootseer import trace as tracing
from bootseer.config import BootseerConfig
from bootseer.deps.prefix import write_json
from bootseer.errors import StoreError
from bootseer.mount.erofs.images import images_dir
from bootseer.node import partfile
from bootseer.tree.blob import BlobLayout, verify_blob, write_blob
from bootseer.tree.writer import ChunkWriter

log = logging.getLogger(__name__)


def blob_path(config: BootseerConfig, layout: BlobLayout) -> Path:
    return images_dir(config.cache.dir) / f"{layout.key}.blob"


def _index_path(config: BootseerConfig, key: str) -> Path:
    return images_dir(config.cache.dir) / f"env-{key.removeprefix('sha256:')}.json"


# -- the node's record ------------------------------------------------------------------------
def remember(config: BootseerConfig, key: str, record: dict) -> None:
    """Record which blob and metadata image serve ``key`` on this node."""
    write_json(_index_path(config, key), {"key": key, **record})


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


# -- verified, unchanged ----------------------------------------------------------------------
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


def verified_unchanged(blob: str) -> bool:
    try:
        stamp = _stamp(blob)
        return bool(stamp["boot"]) and json.loads(Path(blob + ".verified").read_text()) == stamp
    except (OSError, ValueError):
        return False


def mark_verified(blob: str) -> None:
    """Stamp ``blob`` as verified now (every chunk was checked as it was written)."""
    write_json(Path(blob + ".verified"), _stamp(blob))


def local_blob(config: BootseerConfig, store, reader, layout: BlobLayout, key: str, fetcher,
               progress: Callable[[int, int], None] | None, blob: str) -> str:
    """The verified blob at ``blob``: the node's copy when it is still good, else
    fetched."""
    if os.path.exists(blob) and not verified_unchanged(blob):
        log.info("verifying the node's blob of %s (changed since it was verified, or "
                 "verified before this boot)", key[:19])
        try:
            verify_blob(layout, blob)
            write_json(Path(blob + ".verified"), _stamp(blob))
        except (OSError, StoreError) as e:
            log.error("the node's blob of %s fails verification, removed and fetched "
                      "again: %s", key[:19], e)
            Path(blob).unlink(missing_ok=True)
    if not os.path.exists(blob):
        with tracing.phase("deps.fetch") as span:
            from bootseer.tree.peers import fetch_tree  # the job's peers first
            span.set(**(fetch_tree(config, store, reader) or {}))
            total = sum(ref.size for ref in layout.refs)   # the data, not the padding
            span.set(**fetch(reader, layout, blob,
                             (lambda n: progress(n, total)) if progress else None),
                     requests=fetcher.counters()["requests"], blob_bytes=layout.size)
        write_json(Path(blob + ".verified"), _stamp(blob))
    return blob


# -- the fetch --------------------------------------------------------------------------------
def fetch(reader, layout: BlobLayout, dest: str,
          progress: Callable[[int], None] | None = None) -> dict:
    """Write the complete blob of ``reader``'s tree in ``layout`` to ``dest`` (replaced
    atomically). ``progress(bytes)`` is called as each chunk is written. Returns what was
    fetched from the store (``chunks``, ``bytes`` as stored; none when every chunk was in
    the node cache). A chunk that fails verification raises (DigestMismatch) and leaves
    nothing at ``dest``."""
    partfile.sweep_dead(os.path.dirname(dest))
    with partfile.PartFile(dest) as part, \
            ChunkWriter(layout.refs, reader=reader, progress=progress) as writer:
        # no fsync: a crash reboots the node, and a blob from an earlier boot is
        # re-verified before it is mounted
        write_blob(layout, part.fd, writer)
        part.commit(mode=0o444)
    got = writer.fetched()
    return {"chunks": got.chunks, "bytes": got.bytes}
