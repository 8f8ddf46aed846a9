"""``deps verify``'s check of one restored file against its snapshot, read in fixed-size
blocks into one reused buffer: a 2 GB library costs a block of memory, not 2 GB."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

from bootseer.tree.toc import ChunkRef

BLOCK = 1 << 20


def file_matches(path: str, chunks: Sequence[ChunkRef], chunk_size: int, size: int) -> bool:
    """Whether the file at ``path`` has ``size`` bytes whose consecutive ``chunk_size``
    pieces hash to ``chunks``' digests (a TOC entry's). OSError when it cannot be read."""
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size != size:
            return False
        for chunk in chunks:
            digest, left = hashlib.sha256(), chunk_size
            while left:
                n = f.readinto(view[:min(left, BLOCK)])
                if not n:
                    break   # the file's end: the last chunk is the short one
                digest.update(view[:n])
                left -= n
            if "sha256:" + digest.hexdigest() != chunk.digest:
                return False
        # what follows the last chunk (a file that grew since fstat) is not the snapshot's
        return f.read(1) == b""


def bytes_match(path: str, want: bytes) -> bool:
    """Whether the file at ``path`` holds exactly ``want``, compared block by block."""
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    at = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                return at == len(want)
            if view[:n] != want[at:at + n]:
                return False
            at += n
