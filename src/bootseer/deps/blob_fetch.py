"""A snapshot's whole data blob, fetched onto the node as one file (the restore that
``deps ensure`` mounts instead of extracting).

Every chunk not in the node cache is queued at once (the fetcher coalesces neighbours in
a pack into few large requests); chunks are decompressed and verified on a few threads in
blob order and written at their slots as they arrive (``tree.blob.fill_blob``), so a
chunk's bytes are held only until written and nothing is written twice: the blob is the
node's copy of the environment, its chunks are not also put in the node cache.

The blob is written to ``<blob>.part-<pid>-<tag>`` beside its final name, locked by its
writer (``bootseer.node.partfile``), then renamed: a killed fetch leaves no blob that looks whole,
and the next fetch on the node removes every part a dead process left, whichever
environment's blob it was.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from bootseer.node import partfile
from bootseer.store.fetch import Priority
from bootseer.tree.blob import BlobLayout, fill_blob

DECODE_THREADS = 3
DECODE_AHEAD = 64


def fetch_blob(reader, layout: BlobLayout, dest: str,
               progress: Callable[[int], None] | None = None) -> dict:
    """Write the complete blob of ``reader``'s tree in ``layout`` to ``dest`` (replaced
    atomically). ``progress(bytes)`` is called as each chunk is written. Returns what was
    fetched from the store (``chunks``, ``bytes`` as stored; none when every chunk was in
    the node cache). A chunk that fails verification raises (DigestMismatch) and leaves
    nothing at ``dest``."""
    partfile.sweep_dead(os.path.dirname(dest))
    part = partfile.PartFile(dest)
    local, missing = [], []
    for i, ref in enumerate(layout.refs):
        (local if reader.has_chunk(ref) else missing).append((i, ref))
    futures = reader.submit_chunks([ref for _, ref in missing], Priority.DEMAND)
    fetched = 0
    pool = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="bootseer-blob")

    def pieces():
        nonlocal fetched
        for i, ref in local:
            data = reader.chunk(ref)   # the node cache's copy, re-verified; else fetched
            if progress:
                progress(len(data))
            yield i, data
        # decoding runs at most DECODE_AHEAD chunks ahead of the writer
        decoded: list[tuple[int, Future]] = []
        nxt = 0
        while nxt < len(missing) or decoded:
            while nxt < len(missing) and len(decoded) < DECODE_AHEAD:
                (i, ref), fut = missing[nxt], futures[nxt]
                decoded.append((i, pool.submit(lambda r=ref, f=fut: (
                    len(f.result()), reader.decode(f.result(), r)))))
                nxt += 1
            i, fut = decoded.pop(0)
            raw_len, data = fut.result()
            fetched += raw_len
            if progress:
                progress(len(data))
            yield i, data

    try:
        # no fsync (1 GB through it took seconds): a crash reboots the node, and a
        # blob from an earlier boot is re-verified before it is mounted
        fill_blob(layout, part.fd, pieces())
        part.commit(mode=0o444)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        for fut in futures:
            fut.cancel()
        part.close()
    return {"chunks": len(missing), "bytes": fetched}
