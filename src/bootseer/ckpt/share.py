"""Each node stages what its own ranks read, not the whole checkpoint.

In a sharded checkpoint (DCP of an FSDP or tensor-parallel model: one file per rank, written
by that rank) every rank loads its own shard: a node that stages every file moves and stores
``nodes`` times what its ranks need (a terabyte checkpoint on a thousand nodes: a petabyte).
With a node share, a node's prefetch takes

* every small file at once (DCP's ``.metadata``, safetensors headers and indexes: anything up
  to :data:`~bootseer.ckpt.prefetch.SMALL_FILE_BYTES`), which every rank reads first;
* the byte ranges this node's ranks read at their last load of this checkpoint on this
  node (restarts mostly land on the same nodes, with the same ranks), in the order they
  were read, as soon as the start allows; a read outside them is served on demand;
* any other large file from the moment the job first reads it: the ranges the checkpoint's
  recorded access profile says were read of it (another node's ranks read them: the same
  model loads the same parts of a shard), else the whole file, in the background, while
  the reads that came first are served on demand.

DCP spreads the items every rank loads (objects stored as bytes, tensors stored whole such
as an optimizer's step counters) over all the ranks' files, so every rank opens every file.
Of a file that holds such items, a node first *holds* only them (ckpt/engine.py: exact
ranges, in memory, each with a reader's buffer past its end), and streams the file once a
read lands elsewhere in it: a file its ranks only take those items from costs their bytes,
not the file's stripes.

Which ranks a node runs is known only after the rendezvous (torchrun's c10d backend hands
out ranks in joining order), so the node learns its files from its own reads, never from a
guess: a node whose ranks change between starts reads its new files on demand and streams
them at once, and the next start plans from what it read. The history is this node's only
(``<staging>/node-reads-v1/<name>.json``, the access profile's name): the profile a store
shares among nodes says in which order ranges are read, not which files a node needs.

``ckpt.stage`` chooses: ``reads`` (this), ``all`` (every file on every node: a node whose
job reads everything, or a copy staged for a later job), ``auto`` (``reads`` for a job of two
or more nodes whose DCP checkpoint stores tensors in parts, ``all`` otherwise).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from bootseer import redact
from bootseer.ckpt import profile
from bootseer.ckpt.listing import clean
from bootseer.ckpt.view import BLKSIZE

log = logging.getLogger(__name__)
DIR = "node-reads-v1"
MODES = ("auto", "reads", "all")
PAGE = 4096
HOLD_MARGIN = BLKSIZE + 2 * PAGE   # what a buffered read of an item asks past the item


def applies(mode: str, nodes: int) -> bool:
    """Whether a mount may stage this node's reads only (``ckpt.stage``, the job's nodes);
    under ``auto`` the checkpoint's metadata decides (:func:`from_metadata`)."""
    return mode == "reads" or (mode == "auto" and nodes >= 2)


def from_metadata(metadata: bytes, sizes: dict[str, int]
                  ) -> tuple[bool, dict[str, list[tuple[int, int]]]]:
    """From one reading of a checkpoint's ``.metadata``: under ``auto``, whether each rank
    loads its own part, so that a node stages its ranks' reads (only a DCP ``.metadata``
    that stores tensors in parts says so; one that stores every tensor whole, safetensors
    and other files are read whole by every rank: staged whole, the job's peers sharing
    them); and the :func:`held_ranges`."""
    from bootseer.ckpt.named_files import NotCheckpointMetadata, dcp_node_reads
    try:
        sharded, items = dcp_node_reads(metadata)
    except NotCheckpointMetadata:
        return False, {}
    return sharded, _held(items, sizes)


def held_ranges(metadata: bytes, sizes: dict[str, int]) -> dict[str, list[tuple[int, int]]]:
    """Per file, the ranges a node holds for the items every rank reads (DCP's shared items,
    from the page each starts in to a reader's buffer past its end, merged). A file the
    ranges would cover a quarter of or more is left out: it is streamed as a whole."""
    return from_metadata(metadata, sizes)[1]


def _held(items: list[tuple[str, int, int]], sizes: dict[str, int]
          ) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for path, offset, length in items:
        size = sizes.get(path)
        if size is None or offset + length > size:
            continue
        a, b = offset - offset % PAGE, min(size, offset + length + HOLD_MARGIN)
        ranges = out.setdefault(path, [])
        if ranges and a <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], b))
        else:
            ranges.append((a, b))
    return {p: rs for p, rs in out.items() if 4 * sum(b - a for a, b in rs) < sizes[p]}


def history_path(staging_dir: str | os.PathLike, root_url: str) -> Path:
    return Path(staging_dir) / DIR / f"{profile.profile_path(staging_dir, root_url).stem}.json"


class NodeReads:
    """The large files of one checkpoint this node's job reads: what the node stages.

    ``history``: the files read at this node's last load of the same file versions (None:
    no load here yet). The view calls :meth:`read` on each file's first read; a file the
    prefetch did not take yet is handed to ``on_new`` (set by the prefetch's planner)."""

    def __init__(self, staging_dir: str | os.PathLike, root_url: str, *, private: bool = False,
                 auto: bool = False):
        self.staging_dir, self.root_url, self.private = staging_dir, root_url, private
        self.auto = auto   # ckpt.stage auto: only for a checkpoint stored in parts
        self.history: frozenset[str] | None = None
        self.ranges: list[tuple[str, int, int]] = []   # what the last load here read
        self.on_new: Callable[[str], None] | None = None   # set by :meth:`planned`
        self._read: set[str] = set()
        self._taken: set[str] = set()
        self._sources: dict = {}
        self._lock = threading.Lock()

    def load(self, sources: dict) -> frozenset[str] | None:
        """This node's files of the last load, when each is still the version it read."""
        self._sources = sources
        path = history_path(self.staging_dir, self.root_url)
        try:
            doc = json.loads(path.read_text())
            files = doc["files"]
            if not isinstance(files, dict):
                raise ValueError("no files")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.info("node read history %s unreadable (%s): planned from this load's reads",
                     path, e)
            return None
        kept = {rel for rel, key in files.items()
                if rel in sources and sources[rel].key == key}
        self.history = frozenset(kept)
        ranges = doc.get("ranges")
        if isinstance(ranges, list):
            self.ranges = [(r[0], int(r[1]), int(r[2])) for r in ranges
                           if isinstance(r, list) and len(r) == 3 and r[0] in kept
                           and 0 <= int(r[1]) < int(r[2]) <= sources[r[0]].size]
        else:   # no ranges recorded: the files whole
            self.ranges = [(rel, 0, sources[rel].size) for rel in sorted(kept)]
        return self.history

    def take(self, rels) -> None:
        """Files the prefetch streams already (no second plan when the job reads them)."""
        with self._lock:
            self._taken.update(rels)

    def planned(self, on_new: Callable[[str], None]) -> None:
        """The prefetch is planned: ``on_new`` streams a file it did not take, from now on
        and for the files the job read while it was being planned."""
        with self._lock:
            self.on_new = on_new
            waiting = sorted(self._read - self._taken)
            self._taken.update(waiting)
        for rel in waiting:
            on_new(rel)

    def read(self, path: str) -> None:
        """The job read ``path`` (its first read through the view)."""
        rel = clean(path)
        with self._lock:
            if rel in self._read:
                return
            self._read.add(rel)
            hook = self.on_new
            new = hook is not None and rel not in self._taken
            if new:
                self._taken.add(rel)
        if new and hook is not None:
            hook(rel)

    def save(self, recorder=None) -> Path | None:
        """Write the files this load read (with their versions) and, from ``recorder``
        (the engine's :class:`~bootseer.ckpt.profile.AccessRecorder`), the ranges it read
        of them, for the next start here."""
        with self._lock:
            sources = self._sources
            files = {rel: sources[rel].key for rel in sorted(self._read) if rel in sources}
        ranges = None
        if recorder is not None:
            _, read = recorder.under(self.root_url)
            ranges = [r for r in read if r[0] in files]
        if not files:
            return None
        path = history_path(self.staging_dir, self.root_url)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        mode = 0o600 if self.private else 0o644
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, mode)
            json.dump({"v": 1, "url": redact.strip(self.root_url).rstrip("/"),
                       "files": files, **({"ranges": ranges} if ranges is not None else {})},
                      f, separators=(",", ":"))
        os.replace(tmp, path)
        return path
