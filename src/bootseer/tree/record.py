"""Access recording on the read path: for each chunk, when it was first read (seconds
since the window opened), how often, and by which path; and which of its ``BLOCK``-sized
blocks were read, in first-access order (a 4 KiB touch need not make its whole chunk hot).
The window closes on an explicit call, when a trigger file appears, or at a timeout; later
reads are not recorded."""

from __future__ import annotations

import json
import os
import threading
import time

BLOCK = 64 << 10   # the profile's sub-chunk unit: a power of two dividing the chunk size


class AccessRecorder:
    def __init__(self, tree: str, *, timeout_s: float | None = 600.0,
                 trigger_file: str | None = None):
        self.tree, self.timeout_s, self.trigger_file = tree, timeout_s, trigger_file
        self.t0 = time.monotonic()
        self.closed = False
        self.closed_by: str | None = None
        self.chunks: dict[str, list] = {}   # digest -> [first_s, count, path, bytes]
        self.blocks: dict[str, dict[int, None]] = {}   # digest -> its read blocks, in order
        self.local_first_bytes = 0          # bytes already local at their first read
        self.first_bytes = 0
        self._lock = threading.Lock()
        self._checks = 0

    def __call__(self, digest: str, path: str, size: int, local: bool = False,
                 lo: int = 0, hi: int | None = None) -> None:
        """A read of bytes ``lo:hi`` (default: all) of chunk ``digest``."""
        if self.closed:
            return
        now = time.monotonic() - self.t0
        if self.timeout_s is not None and now > self.timeout_s:
            self.close("timeout")
            return
        self._checks += 1
        if self.trigger_file and self._checks % 64 == 0 and os.path.exists(self.trigger_file):
            self.close("trigger file")
            return
        with self._lock:
            rec = self.chunks.get(digest)
            if rec is None:
                self.chunks[digest] = [round(now, 4), 1, path, size]
                self.first_bytes += size
                self.local_first_bytes += size if local else 0
            else:
                rec[1] += 1
            seen = self.blocks.setdefault(digest, {})
            last = (size if hi is None else min(hi, size)) - 1
            for b in range(lo // BLOCK, max(last, lo) // BLOCK + 1):
                seen.setdefault(b)

    def close(self, why: str = "api") -> None:
        if not self.closed:
            self.closed, self.closed_by = True, why
            self.window_s = time.monotonic() - self.t0

    @property
    def coverage(self) -> float | None:
        """Share of the window's read bytes that were already local when first read."""
        return self.local_first_bytes / self.first_bytes if self.first_bytes else None

    def profile(self) -> dict:
        with self._lock:
            rows = sorted(([d, *r] for d, r in self.chunks.items()), key=lambda r: r[1])
            blocks = {d: list(b) for d, b in self.blocks.items()}
        return {"v": 1, "kind": "bootseer.profile", "tree": self.tree, "runs": 1,
                "closed_by": self.closed_by, "chunks": rows, "block_size": BLOCK,
                "blocks": blocks}

    def read_blocks(self) -> dict[str, set[int]]:
        """The blocks read so far, per chunk digest (a copy)."""
        with self._lock:
            return {d: set(self.blocks.get(d, ())) for d in self.chunks}

    @property
    def block_bytes(self) -> int:
        """The bytes of the blocks read (the hot set at block granularity)."""
        with self._lock:
            return sum(block_bytes(r[3], BLOCK, self.blocks.get(d))
                       for d, r in self.chunks.items())

    def save(self, path: str) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.profile(), f)
        os.replace(tmp, path)


def block_bytes(size: int, block: int, blocks) -> int:
    """Bytes of ``blocks`` (indices; None: every block) of a ``size``-byte chunk."""
    if blocks is None:
        return size
    return sum(max(min(block, size - b * block), 0) for b in blocks)
