"""Prefetch plans from a checkpoint's own metadata: which byte ranges of which files, in
the order a load will want them.

* DCP: ``.metadata`` lists every stored item as (relative_path, offset, length); the plan
  is those ranges sorted by file and offset (what ``FileSystemReader`` reads).
* safetensors: the 8-byte little-endian header length + JSON header of each file gives
  every tensor's ``data_offsets``; the plan is the headers first (tiny, needed before any
  tensor), then the tensors in file order.
* anything else: whole files, smallest first.

``split(plan, rank, world)`` gives one process of a node a contiguous 1/world share of the
bytes, so ``world`` local ranks stream a node's copy once, in parallel.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from bootseer.ckpt.listing import PathOutsideRoot, clean
from bootseer.errors import StoreError, UsageError


class PlanError(StoreError):
    """The checkpoint's metadata cannot be read as a plan."""


@dataclass(frozen=True, slots=True)
class Range:
    path: str
    """Relative to the checkpoint directory."""
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


def dcp_plan(url: str, *, opener=None) -> list[Range]:
    """Ranges of a DCP checkpoint directory at ``url`` from its ``.metadata``."""
    from bootseer.ckpt.api import open as ckpt_open
    opener = opener or ckpt_open
    meta_url = url.rstrip("/") + "/.metadata"
    from bootseer.ckpt import named_files
    with opener(meta_url) as f:
        data = f.read()
    try:   # a pickle from the checkpoint's server: read inert (no torch, nothing run)
        items = named_files.dcp_items(data)
    except named_files.NotCheckpointMetadata as e:
        raise PlanError(f"{meta_url}: {e}", url=meta_url) from None
    for path, _offset, _length in items:   # as the mount refuses it: never a quiet skip
        try:
            clean(path)
        except PathOutsideRoot as e:
            raise StoreError(f"{meta_url}: {e}", url=meta_url) from None
    ranges = {Range(path, offset, offset + length) for path, offset, length in items}
    return sorted(ranges, key=lambda r: (r.path, r.start))


def safetensors_header(head: bytes, name: str = "?") -> tuple[int, dict]:
    """(data start offset, header dict) from the first bytes of a safetensors file."""
    if len(head) < 8:
        raise PlanError(f"{name}: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", head[:8])
    if n > 100 * 1024 * 1024:
        raise PlanError(f"{name}: header length {n} is not plausible (not safetensors?)")
    if len(head) < 8 + n:
        raise PlanError(f"{name}: need {8 + n} bytes of header, got {len(head)}")
    try:
        header = json.loads(head[8:8 + n])
    except ValueError as e:
        raise PlanError(f"{name}: safetensors header is not JSON: {e}") from e
    return 8 + n, header


def safetensors_plan(url: str, files: list[str], *, opener=None) -> list[Range]:
    """Headers of every file first, then each file's tensors in offset order."""
    from bootseer.ckpt.api import open as ckpt_open
    opener = opener or ckpt_open
    heads, bodies = [], []
    for rel in files:
        with opener(url.rstrip("/") + "/" + rel) as f:
            first = f.read(8)
            n = struct.unpack("<Q", first)[0] if len(first) == 8 else 0
            base, header = safetensors_header(first + f.read(min(n, 100 * 1024 * 1024)), rel)
        heads.append(Range(rel, 0, base))
        spans = sorted((base + v["data_offsets"][0], base + v["data_offsets"][1])
                       for k, v in header.items() if k != "__metadata__")
        bodies += [Range(rel, s, e) for s, e in spans if e > s]
    return heads + bodies


def merge(plan: list[Range], gap: int = 0) -> list[Range]:
    """Adjacent or overlapping ranges of one file (gap bytes apart at most) become one."""
    out: list[Range] = []
    for r in plan:
        if out and out[-1].path == r.path and out[-1].start <= r.start <= out[-1].end + gap:
            out[-1] = Range(r.path, out[-1].start, max(out[-1].end, r.end))
        else:
            out.append(r)
    return out


def split(plan: list[Range], rank: int, world: int) -> list[Range]:
    """Rank ``rank``'s contiguous 1/``world`` share of the plan's bytes (ranges cut as needed)."""
    if world < 1 or not 0 <= rank < world:
        raise UsageError(f"rank {rank} is not in [0, world={world})")
    total = sum(r.length for r in plan)
    lo, hi = total * rank // world, total * (rank + 1) // world
    out, pos = [], 0
    for r in plan:
        a, b = max(lo, pos), min(hi, pos + r.length)
        if a < b:
            out.append(Range(r.path, r.start + a - pos, r.start + b - pos))
        pos += r.length
    return out


def file_plan(files: dict[str, int]) -> list[Range]:
    """Whole files, smallest first: metadata and headers land before the bulk."""
    return [Range(p, 0, n) for p, n in sorted(files.items(), key=lambda kv: (kv[1], kv[0]))]


def metadata_plan(url: str, files: dict[str, int], *, opener=None) -> tuple[list[Range], str]:
    """The plan from the checkpoint's own metadata and its kind (``dcp``, ``safetensors``),
    or every file (``files``) when there is none. ``files``: relative path -> size."""
    try:
        if ".metadata" in files:
            return dcp_plan(url, opener=opener), "dcp"
        st = sorted(p for p in files if p.endswith(".safetensors"))
        if st:
            return safetensors_plan(url, st, opener=opener), "safetensors"
    except PlanError as e:  # a plan is an optimisation: stream whole files instead
        import logging
        logging.getLogger(__name__).info("no metadata plan for %s: %s", url, e)
    return file_plan(files), "files"
