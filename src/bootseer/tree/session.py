"""One lazily mounted tree (a container image's rootfs, or an environment snapshot with
``deps ensure --mount``), as served by the FUSE child: reader, recorder, prefetcher, and at
the end of the recording window the profile and the start's figures (coverage, precision,
stall time, bytes and requests to the store) written to ``state_dir``."""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, fields
from pathlib import Path

from bootseer.config import BootseerConfig
from bootseer.mount.choose import Serving, What, choose
from bootseer.mount.erofs.kernel import ErofsMountError
from bootseer.mount.handle import MountHandle
from bootseer.mount.serve import (
    UNUSED,
    ErofsTree,
    Tree,
    serve_tree,
    start_blob_server,
    stop_blob_server,
)
from bootseer.store import live
from bootseer.store.client import StoreClient
from bootseer.tree import blob_mount, toc_cache
from bootseer.tree.blob import BlobLayout, BlobView, unsupported
from bootseer.tree.preread import HOTPACK, PREFETCHED
from bootseer.tree.reader import TreeReader
from bootseer.tree.record import BLOCK, AccessRecorder
from bootseer.tree.toc import Toc
from bootseer.tree.view import TreeMountView

log = logging.getLogger(__name__)
TRIGGER = "close-window"
COUNTERS = "counters.json"
"""The session's running counters (cache hits and misses, bytes and requests to the
origin, bytes from peers, stall time, errors), rewritten while it serves: the snapshotter's
``/metrics`` sums them over its mounts."""
COUNTERS_EVERY_S = 2.0


@dataclass(frozen=True, slots=True)
class StartFigures:
    """A start's figures, written as ``figures.json`` when its window closes: the read
    chunks and bytes (``read_block_bytes``: of the blocks read), the share local at first
    read (``coverage``), the share of the prefetched bytes that were read (``precision``:
    whole chunks and the hot pack's blocks, each as fetched),
    the time reads waited for the store
    and how many chunks they waited for, the store's bytes and requests, and the
    prefetch's counts (``Prefetcher.stats``)."""
    tree: str
    window_s: float
    closed_by: str | None
    read_chunks: int
    read_bytes: int
    read_block_bytes: int
    coverage: float | None
    precision: float | None
    stall_s: float
    demand_chunks: int
    store_bytes: int
    store_requests: int
    prefetch: dict | None

    def doc(self) -> dict:
        """The JSON document (keys in field order)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class TreeSession:
    def __init__(self, config: BootseerConfig, tree: str, state_dir: str, *, record: bool = True,
                 profile: dict | None = None, window_timeout_s: float = 600.0,
                 trigger_file: str | None = None):
        self.state = Path(state_dir)
        self.state.mkdir(parents=True, exist_ok=True)
        client = StoreClient.of(config)
        self.store = client.store()
        self.fetcher = client.lane()
        self.cache = client.cache
        self.reader = TreeReader(self.store, tree, self.fetcher, self.cache)
        # store gc on this node keeps the tree while this mount's server lives
        self._live = live.hold(self.cache.root, tree)
        self.recorder = AccessRecorder(tree, timeout_s=window_timeout_s,
                                       trigger_file=trigger_file or str(self.state / TRIGGER))
        self.reader.on_chunk = self.recorder
        self.record = record
        self.prefetcher = None
        done = str(self.state / PREFETCHED)
        if profile is not None:
            from bootseer.peers import share_for
            from bootseer.tree.prefetch import Prefetcher
            self.prefetcher = Prefetcher(self.reader, profile, done_file=done,
                                         peers=share_for(config, self.store),
                                         pack_file=str(self.state / HOTPACK)).start()
        else:
            open(done, "a").close()   # nothing to prefetch
        self._done = threading.Event()
        threading.Thread(target=self._watch_window, daemon=True, name="bootseer-window").start()
        threading.Thread(target=self._write_counters, daemon=True,
                         name="bootseer-counters").start()

    def counters(self) -> dict[str, float]:
        """The running counters (``COUNTERS``)."""
        r, fc = dict(self.reader.counters), self.fetcher.counters()
        pre = dict(self.prefetcher.stats) if self.prefetcher else {}
        return {"cache_hits": r["chunks_local"], "cache_misses": r["chunks_fetched"],
                "stall_s": round(r["stall_s"], 3), "origin_bytes": fc["bytes"],
                "origin_requests": fc["requests"], "peer_bytes": pre.get("peer_bytes", 0),
                "errors": fc["errors"] + pre.get("errors", 0)}

    def _write_counters(self) -> None:
        last: dict[str, float] = {}
        while True:
            now = self.counters()
            if now != last:
                try:
                    tmp = self.state / f".{COUNTERS}.tmp"
                    tmp.write_text(json.dumps(now))
                    tmp.rename(self.state / COUNTERS)
                    last = now
                except OSError:
                    pass   # a metric only: the next round tries again
            time.sleep(COUNTERS_EVERY_S)

    def view(self) -> TreeMountView:
        return TreeMountView(self.reader, on_close=self.finish)

    def _watch_window(self) -> None:
        rec = self.recorder
        while not self._done.is_set():
            if rec.trigger_file and os.path.exists(rec.trigger_file):
                rec.close("trigger file")
            elif rec.timeout_s is not None and time.monotonic() - rec.t0 > rec.timeout_s:
                rec.close("timeout")   # also when no read came after it
            if rec.closed:
                self.finish()
                return
            self._done.wait(0.05)

    def figures(self) -> StartFigures:
        rec, pre = self.recorder, self.prefetcher
        read = rec.read_blocks()
        fc = self.fetcher.counters()
        return StartFigures(
            tree=self.reader.digest, window_s=round(getattr(rec, "window_s", 0.0), 3),
            closed_by=rec.closed_by, read_chunks=len(read), read_bytes=rec.first_bytes,
            read_block_bytes=rec.block_bytes, coverage=rec.coverage,
            precision=pre.precision(read, BLOCK) if pre else None,
            stall_s=round(self.reader.counters["stall_s"], 3),
            demand_chunks=int(self.reader.counters["chunks_fetched"]),
            store_bytes=int(fc["bytes"]), store_requests=int(fc["requests"]),
            prefetch=dict(pre.stats) if pre else None)   # a copy: the prefetch may go on

    def finish(self) -> None:
        """Close the window once: write profile.json and figures.json (atomically)."""
        if self._done.is_set():
            return
        self._done.set()
        self.recorder.close("unmount")   # a no-op when the window already closed
        if (self.state / UNUSED).exists():
            return   # an early blob server stopped unused: the serving mount writes them
        try:
            if self.record:
                self.recorder.save(str(self.state / "profile.json"))
            tmp = self.state / "figures.json.tmp"
            tmp.write_text(json.dumps(self.figures().doc(), default=str))
            tmp.rename(self.state / "figures.json")
        except OSError as e:
            log.warning("cannot write the recording: %s", e)


def window_attrs(figures: dict) -> dict:
    """A start's figures (``figures.json``) as flat trace attributes (``image.window``)."""
    flat = {**figures, **{f"prefetch_{k}": v for k, v in (figures.get("prefetch") or {}).items()}}
    return {k: v for k, v in flat.items() if isinstance(v, (int, float, str)) or v is None}


def _session_view(config, tree, state_dir, record, profile, window_timeout_s) -> TreeMountView:
    """Runs in the mount's server process."""
    return TreeSession(config, tree, state_dir, record=record, profile=profile,
                        window_timeout_s=window_timeout_s).view()


def blob_server_view(config: BootseerConfig, tree: str, state_dir: str, record: bool,
                     profile: dict | None, window_timeout_s: float, hot: list[str],
                     key: str | None) -> BlobView:
    """Runs in the blob's FUSE server process: the tree session behind a one-file view.
    ``key``: the metadata image's blob layout, None for a server started before the
    mounting process had loaded the TOC: then it writes its own beside the state
    (``blob_mount.SERVED_LAYOUT``), which the mount checks before EROFS reads the blob."""
    s = TreeSession(config, tree, state_dir, record=record, profile=profile,
                    window_timeout_s=window_timeout_s)
    layout = BlobLayout(s.reader.toc)
    if key is None:
        blob_mount.served_layout(state_dir, layout.key)
    elif layout.key != key:
        raise ValueError(f"blob layout {layout.key[:12]} differs from the image's {key[:12]}")
    # the pre-read follows the prefetch closely: hot chunks wait for it in memory
    s.reader.keep_fresh(hot, blob_mount.FRESH_BYTES)
    return BlobView(s.reader, layout, on_close=s.finish)


def _kernel_path(config: BootseerConfig, tree: str, toc: Toc, profile: dict | None,
                 state_dir: str, record: bool, window_timeout_s: float,
                 name: str) -> ErofsTree | str:
    """The tree on the kernel path (or why it cannot be an EROFS image)."""
    why = unsupported(toc)
    if why is not None:
        return why
    hot = [row[0] for row in profile["chunks"]] if profile else []
    layout = BlobLayout(toc)   # the profile's own: its metadata image was made once
    view = functools.partial(blob_server_view, config, tree, state_dir, record, profile,
                             window_timeout_s, hot, layout.key)
    return blob_mount.erofs_tree(config, tree, toc, layout, hot, view,
                                 blob_server=_blob_server_name(name, tree), profile=profile)


def _blob_server_name(name: str, tree: str) -> str:
    return f"{name}-blob-{tree[7:19]}"


def _early_blob_server(config: BootseerConfig, tree: str, state_dir: str, record: bool,
                       profile: dict | None, window_timeout_s: float,
                       name: str) -> Future[MountHandle] | None:
    """The blob server, started before this process loads the TOC (its own process loads
    it meanwhile: the two no longer wait for each other), where the tree will be served
    on the kernel path and its blob was not local at the last mount here; else None."""
    try:
        if choose(config, What.TREE) is not Serving.EROFS_FUSE_BLOB:
            return None
    except ErofsMountError:
        return None   # serve_tree says why
    if blob_mount.was_local(config, tree):
        return None
    hot = [row[0] for row in profile["chunks"]] if profile else []
    view = functools.partial(blob_server_view, config, tree, state_dir, record, profile,
                             window_timeout_s, hot, None)
    return start_blob_server(view, state_dir, _blob_server_name(name, tree))


def mount_tree(config: BootseerConfig, tree: str, mountpoint: str, state_dir: str, *,
               record: bool = True, prefetch: bool = True, profile_digest: str | None = None,
               window_timeout_s: float = 600.0,
               name: str = "bootseer-tree") -> tuple[MountHandle, dict | None, dict]:
    """Check ``tree`` and load its profile (errors surface here, before mounting), then
    serve it at ``mountpoint`` as :mod:`bootseer.mount.choose` says: the kernel's EROFS,
    else the FUSE tree view. Returns (the mount handle, profile or None, the tree's
    meta)."""
    from bootseer.tree import profile as prof
    from bootseer.tree.reader import load_toc
    client = StoreClient.of(config)
    store = client.store()
    profile = None
    if prefetch:   # a profile for another tree fails here, before anything starts
        profile = prof.load(store, profile_digest) if profile_digest else prof.latest(store, tree)
        if profile is not None:
            prof.check(profile, tree)
    early = _early_blob_server(config, tree, state_dir, record, profile, window_timeout_s,
                               name)
    try:
        with client.lane() as f:   # unknown tree / unparsable TOC: fail before mounting
            toc = load_toc(store, tree, f, client.cache)   # (cached: the server's hits)
    except BaseException:
        if early is not None:
            stop_blob_server(early)
        raise
    served = Tree(
        label=tree[:19], name=f"{name}-{tree[7:19]}",
        view=functools.partial(_session_view, config, tree, state_dir, record, profile,
                               window_timeout_s),
        erofs=functools.partial(_kernel_path, config, tree, toc, profile, state_dir, record,
                                window_timeout_s, name),
        early_blob=early)
    handle = serve_tree(config, served, mountpoint, state_dir)
    # after the job's start, not on its path: the next start here loads the records
    toc_cache.save_later(client.cache.root, tree, toc)
    return handle, profile, toc.meta
