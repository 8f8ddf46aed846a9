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
from pathlib import Path

from bootseer.config import BootseerConfig
from bootseer.store.client import StoreClient
from bootseer.tree.reader import TreeReader
from bootseer.tree.record import AccessRecorder
from bootseer.tree.view import TreeMountView

log = logging.getLogger(__name__)
TRIGGER = "close-window"
PREFETCHED = "prefetched"   # created in state_dir when the hot blocks are local


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
                                         peers=share_for(config, self.store)).start()
        else:
            open(done, "a").close()   # nothing to prefetch
        self._done = threading.Event()
        threading.Thread(target=self._watch_window, daemon=True, name="bootseer-window").start()

    def view(self) -> TreeMountView:
        return TreeMountView(self.reader, on_close=self.finish)

    def _watch_window(self) -> None:
        rec = self.recorder
        while not self._done.is_set():
            if os.path.exists(rec.trigger_file):
                rec.close("trigger file")
            elif rec.timeout_s is not None and time.monotonic() - rec.t0 > rec.timeout_s:
                rec.close("timeout")   # also when no read came after it
            if rec.closed:
                self.finish()
                return
            self._done.wait(0.05)

    def figures(self) -> dict:
        rec = self.recorder
        read = set(rec.chunks)
        pre = self.prefetcher
        # a copy: the prefetch may still be adding (set() copies a set without running
        # Python code, so under the GIL; iterating the live set raised RuntimeError)
        prefetched = set(pre.prefetched) if pre else set()
        sizes = {c[0]: c[4] for c in self.reader.all_chunks()}
        pre_bytes = sum(sizes.get(d, 0) for d in prefetched)
        used = sum(sizes.get(d, 0) for d in prefetched & read)
        fc = self.fetcher.counters()
        return {"tree": self.reader.digest, "window_s": round(getattr(rec, "window_s", 0.0), 3),
                "closed_by": rec.closed_by, "read_chunks": len(read),
                "read_bytes": rec.first_bytes, "coverage": rec.coverage,
                "precision": (used / pre_bytes) if pre_bytes else None,
                "stall_s": round(self.reader.counters["stall_s"], 3),
                # chunks a read had to wait for from the store (the stalls' count)
                "demand_chunks": self.reader.counters["chunks_fetched"],
                "store_bytes": fc["bytes"], "store_requests": fc["requests"],
                "prefetch": pre.stats if pre else None}

    def finish(self) -> None:
        """Close the window once: write profile.json and figures.json (atomically)."""
        if self._done.is_set():
            return
        self._done.set()
        self.recorder.close("unmount")   # a no-op when the window already closed
        try:
            if self.record:
                self.recorder.save(str(self.state / "profile.json"))
            tmp = self.state / "figures.json.tmp"
            tmp.write_text(json.dumps(self.figures(), default=str))
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


def mount_tree(config: BootseerConfig, tree: str, mountpoint: str, state_dir: str, *,
               record: bool = True, prefetch: bool = True, profile_digest: str | None = None,
               window_timeout_s: float = 600.0, name: str = "bootseer-tree"):
    """Check ``tree`` and load its profile (errors surface here, before mounting), then
    serve it at ``mountpoint``: the kernel's EROFS where ``bootseer.mount.tree_backend``
    says so, else the FUSE tree view. Returns (a mount handle, profile or None, the
    tree's meta)."""
    from bootseer.mount.fuse import mount
    from bootseer.tree import profile as prof
    from bootseer.tree.reader import load_toc
    client = StoreClient.of(config)
    store = client.store()
    with client.lane() as f:   # unknown tree / unparsable TOC: fail before mounting
        toc = load_toc(store, tree, f, client.cache)   # (cached: the server's hits)
    profile = None
    if prefetch:
        profile = prof.load(store, profile_digest) if profile_digest else prof.latest(store, tree)
        if profile is not None:
            prof.check(profile, tree)
    from bootseer.mount import tree_backend
    if tree_backend(config) == "erofs":   # the kernel path (bootseer.tree.blob_mount)
        from bootseer.tree.blob import unsupported
        why = unsupported(toc)
        if why is None:
            from bootseer.mount.erofs.kernel import ErofsMountError
            from bootseer.tree.blob_mount import mount_tree_erofs
            try:
                return (mount_tree_erofs(config, tree, toc, profile, mountpoint, state_dir,
                                         record=record, window_timeout_s=window_timeout_s,
                                         name=name), profile, toc.get("meta") or {})
            except ErofsMountError as e:   # nothing of it is left mounted
                if config.mount.backend == "erofs":
                    raise
                why = str(e)
        log.warning("tree %s is served by the FUSE tree view: %s", tree[:19], why)
    factory = functools.partial(_session_view, config, tree, state_dir, record, profile,
                                window_timeout_s)
    return (mount(factory, mountpoint, name=f"{name}-{tree[7:19]}"), profile,
            toc.get("meta") or {})
