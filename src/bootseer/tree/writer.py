"""The one writer of a tree's chunks to disk: a restore's files (``extract``) and a tree's
data blob (``blob``) both write through a ``ChunkWriter``.

A writer is told up front every chunk it will write, in order (``order``, a chunk once
per write). Every chunk that is not local is then queued at once (the fetcher coalesces
neighbours in a pack into few large requests); decompressing and verifying run on a few
threads (zstd and sha256 release the GIL) in the order the writes consume the chunks, at
most ``DECODE_AHEAD`` ahead, so decoding and writing overlap the transfer. A chunk's bytes
are kept only while a later write still needs them, and nothing unverified is written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Self

from bootseer.store.fetch import Priority
from bootseer.tree.reader import TreeReader
from bootseer.tree.toc import ChunkRef

DECODE_THREADS = 3
DECODE_AHEAD = 64


@dataclass(frozen=True, slots=True)
class Fetched:
    """What a writer fetched from the store: ``chunks`` queued, the ``bytes`` (as stored)
    that arrived, and when the last of them did (wall time; None when nothing came)."""
    chunks: int
    bytes: int
    last_at: float | None


class ChunkWriter:
    """Writes the chunks of ``order`` at the places its callers name. Chunks come from
    ``reader`` (fetched when not local; with ``reader.chunk`` for the local ones), or,
    without a reader, from ``local(ref, path)`` alone. ``progress(bytes)`` is called once
    per distinct chunk, when it is first written."""

    def __init__(self, order: Sequence[ChunkRef], *, reader: TreeReader | None = None,
                 local: Callable[[ChunkRef, str], bytes] | None = None,
                 progress: Callable[[int], None] | None = None):
        if local is None:
            if reader is None:
                raise ValueError("a ChunkWriter needs a reader or a local source")
            local = reader.chunk
        self._local, self._reader, self._progress = local, reader, progress
        self._uses: dict[str, int] = {}
        for ref in order:
            self._uses[ref.digest] = self._uses.get(ref.digest, 0) + 1
        self._kept: dict[str, bytes] = {}
        self._decoded: dict[str, Future] = {}
        self._pending: dict[str, Future] = {}   # fetches not yet handed to a decoder
        self._fetch_order: list[ChunkRef] = []
        self._next = 0
        self._stored_bytes = 0
        self._last_at: float | None = None
        self._pool: ThreadPoolExecutor | None = None
        if reader is not None:
            self._queue(reader, order)

    def _queue(self, reader: TreeReader, order: Sequence[ChunkRef]) -> None:
        missing: dict[str, ChunkRef] = {}
        for ref in order:
            if ref.digest not in missing and not reader.has_chunk(ref):
                missing[ref.digest] = ref
        self._fetch_order = list(missing.values())
        if not self._fetch_order:
            return
        futures = reader.submit_chunks(self._fetch_order, Priority.DEMAND)
        self._pending = dict(zip(missing, futures))
        for fut in futures:
            fut.add_done_callback(self._arrived)
        self._pool = ThreadPoolExecutor(max_workers=DECODE_THREADS,
                                        thread_name_prefix="bootseer-decode")

    def _arrived(self, _fut: Future) -> None:
        self._last_at = time.time()

    def _refill(self) -> None:
        assert self._reader is not None and self._pool is not None
        decode = self._reader.decode

        def decoded(ref: ChunkRef, fetch: Future) -> tuple[int, bytes]:
            raw = fetch.result()
            return len(raw), decode(raw, ref)
        while self._next < len(self._fetch_order) and len(self._decoded) < DECODE_AHEAD:
            ref = self._fetch_order[self._next]
            self._next += 1
            self._decoded[ref.digest] = self._pool.submit(decoded, ref,
                                                          self._pending.pop(ref.digest))

    def _bytes(self, ref: ChunkRef, path: str) -> bytes:
        digest = ref.digest
        data = self._kept.get(digest)
        if data is None:
            if self._pool is not None:
                self._refill()
            fut = self._decoded.pop(digest, None)
            if fut is not None:
                stored, data = fut.result()
                self._stored_bytes += stored
            else:
                data = self._local(ref, path)
            if self._progress:
                self._progress(len(data))
        left = self._uses.get(digest, 1) - 1
        self._uses[digest] = left
        if left > 0:
            self._kept[digest] = data
        else:
            self._kept.pop(digest, None)
        return data

    def write(self, fd: int, ref: ChunkRef, offset: int, path: str = "") -> int:
        """Write the chunk's verified bytes at ``offset`` of the file open at ``fd``;
        returns how many. ``path`` is the tree path it belongs to (for the access
        recorder, when the chunk is read through the reader)."""
        data = self._bytes(ref, path)
        write_at(fd, data, offset)
        return len(data)

    def fetched(self) -> Fetched:
        return Fetched(len(self._fetch_order), self._stored_bytes, self._last_at)

    def close(self) -> None:
        """Stop decoding what was not yet written. Fetches already queued run to their
        end: the fetcher completes every request it was given (a future cancelled under
        it would fail its worker)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_at(fd: int, data: bytes, offset: int) -> None:
    """All of ``data`` at ``offset`` of the file open at ``fd`` (a short write resumes)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
