"""Plan prefetch: stream a plan's byte ranges into the staging area before anyone reads.

A background thread issues the stripes covering each range, in plan order, as read-ahead:
it takes only budget that is free (a demand read always goes first) and waits for room
otherwise, so a plan larger than the budget streams at the budget's pace. Stripes already
staged or in flight are skipped, so a reader racing the plan never fetches twice.

``start_after``: a file whose creation releases the large files (small ones, such as DCP's
``.metadata`` and safetensors headers, go at once). ``bootseer run`` creates it when the
image and the environment are prepared, so the checkpoint, needed only once the job has
imported its code, does not take the link from what the job needs first.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass

from bootseer import redact
from bootseer.ckpt.source import FileSource

log = logging.getLogger(__name__)

SMALL_FILE_BYTES = 1 << 20  # metadata and headers: never held back by start_after


@dataclass(frozen=True, slots=True)
class Span:
    """``[start, end)`` of one file's source."""
    source: FileSource
    start: int
    end: int


class Prefetch:
    """One plan streaming in; ``join`` waits until every stripe landed (or failed)."""

    def __init__(self, engine, spans: list[Span], *, start_after: str | None = None,
                 wait_max_s: float = 300.0, peers=None):
        self.engine = engine
        self.peers = peers   # callable(stop) -> figures: the large files through the job's peers
        self.peer_figures: dict = {}
        if start_after or peers:
            spans = ([s for s in spans if s.source.size <= SMALL_FILE_BYTES]
                     + [s for s in spans if s.source.size > SMALL_FILE_BYTES])
        self.spans, self.start_after, self.wait_max_s = spans, start_after, wait_max_s
        self.issued: list[tuple[str, int, int]] = []
        """(url, start, end) of every stripe this prefetch requested, in order."""
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="bootseer-ckpt-prefetch")
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()

    def _stopped(self) -> bool:
        return self._stop.is_set() or self.engine.closed

    def _run(self) -> None:
        pending = []
        held = self.start_after or None   # the large files wait for this file, once
        peered = self.peers is None
        for span in self.spans:
            if span.source.size > SMALL_FILE_BYTES:
                if held is not None:
                    self._wait_start_signal(held)
                    held = None
                if not peered:   # the large files: the job's peers first, then the rest
                    self._through_peers()
                    peered = True
            f = self.engine.file(span.source)
            S = f.S
            for idx in range(span.start // S, (min(span.end, f.size) - 1) // S + 1):
                while True:
                    if self._stopped():
                        return
                    got = f.issue(idx, demand=False)
                    if got is not False:
                        break
                    self.engine.budget.wait_room(0.1)
                if got is not True:
                    self.issued.append((span.source.url, *f.staged.span(idx)))
                    pending.append((f, idx, got))
        for f, idx, got in pending:
            got.landed.wait()
            if not f.staged.has(idx):
                self.failed += 1
        if self.failed:  # the readers that need these stripes fetch them again
            log.info("checkpoint prefetch: %d of %d stripes failed", self.failed, len(pending))

    def _through_peers(self) -> None:
        """Stage what the job's peers (and this node's share of the origin) bring;
        the plan's stripes still missing after it are fetched as without peers."""
        figures = self.peers(self._stop) or {}
        self.peer_figures = figures
        counters = self.engine.counters
        counters.add(peer_bytes=figures.get("peer_bytes", 0))
        counters.peers_role = figures.get("peers_role")

    def _wait_start_signal(self, path: str) -> None:
        deadline = time.monotonic() + self.wait_max_s
        while (not os.path.exists(path) and time.monotonic() < deadline
               and not self._stopped()):
            time.sleep(0.05)


def stage_whole(engine, sources) -> Prefetch:
    """Every stripe of ``sources`` from the origin (a manifest's maker, ckpt.peers)."""
    return Prefetch(engine, [Span(s, 0, s.size) for s in sources])


def start_plan(engine, remote, *, rank: int | None = None, world: int | None = None,
               start_after: str | None = None, config=None,
               node_reads=None) -> tuple[Prefetch, str]:
    """Start streaming the checkpoint at ``remote`` (a RemoteDir) through ``engine``.

    The plan is the access profile recorded by the previous load of these very file
    versions (ckpt/profile.py) or else the checkpoint's own metadata plan (ckpt/plan.py),
    then the rest of every file, so the staging copy ends complete (``staged_mirror``).
    With ``rank``/``world``, only this rank's 1/world share of the plan: the node's ranks
    stream it once, together. Without them and with a ``config`` whose peers settings
    apply (docs/peers.md), the large files come through the job's peers first. Returns the
    prefetch and the plan's kind (``profile``, ``dcp``, ``safetensors`` or ``files``).
    With ``node_reads`` (a :class:`bootseer.ckpt.share.NodeReads`), the node stages only
    the small files and the large ones its job reads (ckpt/share.py)."""
    from bootseer.ckpt import plan as plans
    from bootseer.ckpt import profile
    from bootseer.ckpt.api import open as ckpt_open
    sources = remote.walk()
    sizes = {p: s.size for p, s in sources.items()}
    recorded, why = profile.load(engine.staging.dir, remote.url, sources,
                                 store_url=engine.store_url)
    if recorded:
        ranges, kind = [plans.Range(p, a, b) for p, a, b in recorded], "profile"
    else:
        log.info("checkpoint %s: %s, planning from its metadata", redact.url(remote.url), why)
        with engine.internal_reads():   # the plan's reads are not the load's
            ranges, kind = plans.metadata_plan(remote.url, sizes,
                                               opener=lambda url: ckpt_open(url, engine=engine))
    held: dict = {}   # file -> the ranges held for the items every rank reads (ckpt.share)
    if node_reads is not None:
        from bootseer.ckpt import share
        metadata = _dcp_metadata(engine, remote, sizes)
        sharded, held = share.from_metadata(metadata, sizes) if metadata else (False, {})
        if node_reads.auto and not sharded:
            log.info("checkpoint %s: every rank reads it whole: this node stages every file",
                     redact.url(remote.url))
            node_reads = None
    wanted_files = set(sources)
    if world is not None:
        ranges = plans.split(ranges, rank or 0, world)
    else:
        partial: list = []
        if node_reads is not None:
            wanted_files, partial = _node_share(engine, node_reads, sources, ranges,
                                                exact=kind == "profile", held=held)
            ranges = [r for r in ranges if r.path in wanted_files]
        ranges = ranges + plans.file_plan({p: n for p, n in sizes.items() if p in wanted_files})
        ranges += partial   # what this node read last time of files it reads in part
    spans = [Span(sources[r.path], r.start, r.end) for r in ranges if r.path in sources]
    peers = None
    if world is None and config is not None:
        from bootseer.ckpt.peers import fetch_checkpoint, wanted
        # Peers exchange a set every node of the job wants (one manifest): a node share
        # that is a few shards (each node its own) comes from the origin.
        large = [s for p, s in sources.items() if s.size > SMALL_FILE_BYTES
                 and p in wanted_files]
        if len(large) < sum(1 for s in sources.values() if s.size > SMALL_FILE_BYTES):
            large = []
        if large and wanted(config, sum(s.size for s in large)):
            peers = functools.partial(fetch_checkpoint, config, engine, large,
                                      functools.partial(stage_whole, engine))
    return Prefetch(engine, spans, start_after=start_after, peers=peers), kind


def _dcp_metadata(engine, remote, sizes: dict) -> bytes | None:
    """A DCP checkpoint's ``.metadata`` (None: there is none, or it cannot be read)."""
    from bootseer.ckpt.api import open as ckpt_open
    if ".metadata" not in sizes:
        return None
    try:
        with engine.internal_reads(), \
                ckpt_open(remote.url.rstrip("/") + "/.metadata", engine=engine) as f:
            return f.read()
    except OSError:
        return None


def _node_share(engine, node_reads, sources: dict, ranges: list, *,
                exact: bool, held: dict) -> tuple[set[str], list]:
    """What is staged at once: (files whole: the small ones and those this node read whole
    last time, the ranges it read of the others); from then on, a large file the job
    starts reading streams from its first read: the ranges the recorded access profile
    says were read of it (``exact``: the plan is such a profile; its other bytes are
    read on demand), else the whole file. A file with ``held`` ranges (the items every
    rank reads, ckpt.share.held_ranges) is held instead, and streamed only once a read
    lands elsewhere in it."""
    from bootseer.ckpt import plan as plans
    history = node_reads.load(sources) or frozenset()
    read = plans.merge([plans.Range(*r) for r in sorted(node_reads.ranges)])
    covered: dict[str, int] = {}
    for r in read:
        covered[r.path] = covered.get(r.path, 0) + r.length
    whole = {p for p, s in sources.items() if s.size <= SMALL_FILE_BYTES} | \
        {p for p in history if covered.get(p, 0) >= sources[p].size}

    planned: dict[str, list] = {}   # the plan's ranges per file, in plan order
    for r in ranges:
        planned.setdefault(r.path, []).append(r)

    def stream(rel: str) -> None:
        src = sources[rel]
        order = planned.get(rel, [])
        # a profile that read only the held items of this file (a node whose ranks did not
        # own it) says nothing of the part a read elsewhere in it now asks for
        if not (exact and order) or all(_inside(r, held.get(rel, ())) for r in order):
            order = [plans.Range(rel, 0, src.size)]
        Prefetch(engine, [Span(src, r.start, r.end) for r in order])

    def hold(rel: str) -> bool:
        return rel in held and engine.file(sources[rel]).hold(
            held[rel], functools.partial(stream, rel))

    partial = [r for r in read if r.path not in whole]
    # a file this node read only the held items of (each of its reads began in one: the
    # rest is a reader's buffer and the kernel's read-ahead) is held; one it read other
    # parts of (ranks that load another world size's shards) has those parts staged
    outside = {r.path for r in partial
               if not any(a <= r.start < b for a, b in held.get(r.path, ()))}
    held_now = {p for p in {r.path for r in partial} - outside if hold(p)}
    partial = [r for r in partial if r.path not in held_now]
    node_reads.take(whole | history)
    large = sum(s.size for s in sources.values() if s.size > SMALL_FILE_BYTES)
    now = sum(sources[p].size for p in whole if sources[p].size > SMALL_FILE_BYTES) + \
        sum(r.length for r in partial) + sum(b - a for p in held_now for a, b in held[p])
    log.info("checkpoint %s: this node stages %d of %d large bytes now (%s), the rest as "
             "its ranks read it", redact.url(node_reads.root_url), now, large,
             "what it read last time" if history else "no load here yet")

    def on_new(rel: str) -> None:
        if rel in sources and not engine.closed and not hold(rel):
            stream(rel)
    node_reads.planned(on_new)
    return whole, partial


def _inside(r, spans) -> bool:
    return any(a <= r.start and r.end <= b for a, b in spans)


def start_plan_soon(engine, remote, **kw) -> threading.Thread:
    """:func:`start_plan` in the background (listing and metadata reads included), so a
    mount is up at once; a planning failure is logged, never fatal: reads still work."""
    def run() -> None:
        try:
            start_plan(engine, remote, **kw)
        except Exception as e:  # noqa: BLE001 - prefetch is an optimisation
            if not engine.closed:
                log.warning("checkpoint prefetch of %s did not start: %s",
                            redact.url(remote.url), redact.text(str(e)))
    t = threading.Thread(target=run, daemon=True, name="bootseer-ckpt-plan")
    t.start()
    return t
