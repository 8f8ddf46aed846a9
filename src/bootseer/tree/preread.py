"""The pre-read of a kernel-path mount (EROFS on a FUSE-served blob): the profile's hot
chunks are read through the EROFS files that hold them, each as soon as the prefetch has
made it local, so the kernel's page cache holds them and the job's reads of them reach no
Python.

Two things keep the pre-read from costing the job anything:

* it reads exactly the hot bytes (the blocks the profile says the start read, or the
  whole chunk when it names none): the file is opened with ``POSIX_FADV_RANDOM``, so
  the kernel's read-ahead never runs past a hot range into the file's next chunk (a cold
  one: it would be fetched on demand, a stall on the link the job shares, and recorded
  into the next profile as if the job had read it);
* it never makes a chunk come from the store: it follows the prefetch in profile order,
  and a chunk still not local once the prefetch is done is left to the job.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from bootseer.tree.blob import BlobLayout

log = logging.getLogger(__name__)
PIECE = 1 << 20
POLL_S = 0.01
PREFETCHED = "prefetched"   # created in a mount's state dir when the hot blocks are local
HOTPACK = "hotpack.json"    # the hot pack's blocks kept, per chunk digest (the prefetch's)


@dataclass(frozen=True, slots=True)
class HotRange:
    """A hot chunk where one file of the tree holds it: ``length`` bytes at ``offset``
    of ``path``; ``blocks``: the chunk's blocks they are (none known: the whole chunk)."""
    digest: str
    path: str
    offset: int
    length: int
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Preread:
    """What a pre-read did: the hot ranges (and bytes) read into the page cache, and
    those skipped because the prefetch did not make them local."""
    chunks: int = 0
    bytes: int = 0
    skipped_chunks: int = 0
    skipped_bytes: int = 0


def hot_ranges(layout: BlobLayout, hot: list[str],
               profile: dict | None = None) -> list[HotRange]:
    """Each hot chunk (``hot``: digests in profile order), where one file of the tree
    holds it: its read blocks (runs of neighbours as one range, in first-access order)
    when ``profile`` names them, else the whole chunk."""
    bsize = (profile or {}).get("block_size")
    blocks = (profile or {}).get("blocks") or {}
    out = []
    for d in dict.fromkeys(hot):
        if d not in layout.where:
            continue
        path, i = layout.where[d]
        size = layout.ref_of[d].size
        base = i * layout.chunk_size
        if not bsize:
            out.append(HotRange(d, path, base, size))
            continue
        mine = blocks.get(d)
        if mine is None:   # read whole: every block
            mine = range(-(-size // bsize))
        runs: list[list[int]] = []   # [first block, blocks]
        for b in mine:
            if b * bsize >= size:
                continue
            if runs and runs[-1][0] + runs[-1][1] == b:
                runs[-1][1] += 1
            else:
                runs.append([b, 1])
        for b, n in runs:
            lo = b * bsize
            out.append(HotRange(d, path, base + lo, min(n * bsize, size - lo),
                                tuple(range(b, b + n))))
    return out


def preread(mountpoint: str, hot: list[HotRange], is_local, prefetched: Path,
            done: Path, stop: threading.Event, wait_s: float = 600.0,
            pack_file: Path | None = None) -> Preread:
    """Read each hot range through ``mountpoint`` once ``is_local(digest)`` says its chunk
    is in the node cache, or ``pack_file`` (written by the prefetch) says a hot pack
    brought its blocks; after ``prefetched`` appears (or ``wait_s``), ranges still not
    local are skipped. Creates ``done`` at the end. Never raises: an error only costs the
    warm-up."""
    chunks = nbytes = skipped_chunks = skipped_bytes = 0
    packed: dict[str, set[int]] | None = None

    def here(r: HotRange) -> bool:
        nonlocal packed
        if is_local(r.digest):
            return True
        if packed is None and pack_file is not None and pack_file.exists():
            try:
                packed = {d: set(b) for d, b in json.loads(pack_file.read_text()).items()}
            except (OSError, ValueError, AttributeError, TypeError):
                packed = {}
        return bool(r.blocks) and packed is not None and set(r.blocks) <= packed.get(
            r.digest, set())

    def figures() -> Preread:
        return Preread(chunks, nbytes, skipped_chunks, skipped_bytes)
    current: tuple[str, int] | None = None   # the file open now (path, fd)
    waited, given_up = 0.0, False
    try:
        for r in hot:
            while not given_up and not here(r):
                if prefetched.exists() or waited > wait_s:
                    given_up = True   # the prefetch is over: what is not local stays so
                    break
                if stop.wait(POLL_S):
                    return figures()
                waited += POLL_S
            if stop.is_set():
                return figures()
            if given_up and not here(r):
                skipped_chunks += 1
                skipped_bytes += r.length
                continue
            try:
                if current is None or current[0] != r.path:
                    if current is not None:
                        os.close(current[1])
                        current = None
                    fd = os.open(mountpoint + r.path, os.O_RDONLY | os.O_NOFOLLOW)
                    current = (r.path, fd)
                    # read exactly the hot ranges: no read-ahead into the next (cold)
                    # chunk. SEQUENTIAL first: it doubles this file's read-ahead size,
                    # which RANDOM keeps as the most one kernel read of a range brings
                    # (the mount's read-ahead is small: see mount.erofs.kernel)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                nbytes += _read_range(current[1], r.offset, r.length)
                chunks += 1
            except OSError as e:   # a chunk that cannot be served: the job will say so
                log.info("pre-read of %s at %d stopped: %s", r.path, r.offset, e)
        log.info("pre-read %d hot chunks (%d bytes) into the page cache; %d not local, "
                 "left to the job", chunks, nbytes, skipped_chunks)
        return figures()
    finally:
        if current is not None:
            os.close(current[1])
        try:
            done.touch()
        except OSError:   # the state directory is gone: the mount is going away
            pass


def _read_range(fd: int, offset: int, length: int) -> int:
    got = 0
    while length > 0:
        n = len(os.pread(fd, min(PIECE, length), offset))
        if not n:
            break
        offset, length, got = offset + n, length - n, got + n
    return got
