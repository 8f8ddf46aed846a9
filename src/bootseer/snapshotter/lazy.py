"""Converted images as remote snapshots: containerd never downloads their layers.

containerd's unpacker prepares an image's layers bottom-up, each as ``Prepare(key,
parent, labels)`` with ``containerd.io/snapshot.ref`` = the layer's chain ID, and skips a
layer when Prepare answers ALREADY_EXISTS and a snapshot of that chain ID then exists.
With ``disable_snapshot_annotations = false`` the CRI adds the image's manifest digest and
reference. When they name an image ``bootseer image convert`` converted (found by the
store ref ``images/by-manifest/<digest>``, else through the referrer announced next to the
image) whose recorded chain IDs hold the target, the layer is committed at once:

- below the top: an empty placeholder (the tree is flat: every file is in the top one);
- the top: the lazily mounted tree (hot-block prefetch from the published profile, access
  recording), so a container's overlay has the whole image as its lowest directory.

A placeholder below the top is only right beneath the next layer of the same image: a
snapshot of another image stacked on it (a shared base layer) is refused loudly, never
built on an empty base. Prefetch and recording windows close at a timeout or when a
container on the image creates the ready file (``$BOOTSEER_READY_FILE`` in the pod, seen in
the container's upper directory); the profile is then merged and published.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass

from bootseer.config import BootseerConfig
from bootseer.snapshotter.holder import Holder, HolderSpec
from bootseer.snapshotter.metadata import Snapshot
from bootseer.tree.session import COUNTERS

log = logging.getLogger(__name__)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")   # labels come from images: never trusted

REF = "containerd.io/snapshot.ref"
CRI_MANIFEST = "containerd.io/snapshot/cri.manifest-digest"
CRI_IMAGE = "containerd.io/snapshot/cri.image-ref"
TREE = "bootseer.dev/tree"
LAYER = "bootseer.dev/layer"     # "<index>/<count>" of the image's layers
TOP = "bootseer.dev/top"         # "true" on the snapshot that mounts the tree


@dataclass(frozen=True, slots=True)
class Match:
    tree: str
    index: int
    count: int

    @property
    def top(self) -> bool:
        return self.index == self.count - 1

    def labels(self) -> dict[str, str]:
        out = {TREE: self.tree, LAYER: f"{self.index}/{self.count}"}
        if self.top:
            out[TOP] = "true"
        return out


def read_counters(state: str) -> dict[str, float]:
    """A tree session's counters (``counters.json``, rewritten as it serves); empty when
    it wrote none yet."""
    try:
        with open(os.path.join(state, COUNTERS)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in doc.items() if isinstance(v, (int, float))}


def placeholder_below_top(s: Snapshot) -> bool:
    return TREE in s.labels and s.labels.get(TOP) != "true"


def is_top(s: Snapshot) -> bool:
    return s.labels.get(TOP) == "true"


class LazyImages:
    def __init__(self, config: BootseerConfig, *, window_s: float = 120.0,
                 ready_file: str = "/run/bootseer/ready"):
        self.config = config
        self.window_s = window_s
        self.ready_file = ready_file.lstrip("/")
        self._chains: dict[str, list[str]] = {}   # tree -> chain IDs (TOCs never change)
        self._mounts: dict[int, tuple[Holder, str]] = {}   # snapshot id -> (holder, state)
        self._mount_locks: dict[int, threading.Lock] = {}
        self._retired: dict[str, float] = {}
        self.counts = {"mounts_started": 0, "mounts_adopted": 0, "mount_failures": 0}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watchers: dict[int, list[str]] = {}  # top snapshot id -> upper dirs on it
        threading.Thread(target=self._watch, daemon=True, name="bootseer-ready").start()

    # -- which image is this? -----------------------------------------------------------
    def match(self, labels) -> Match | None:
        """The converted image layer these Prepare labels describe, or None (an ordinary
        snapshot). A store that cannot answer is logged and means None: the layer is then
        pulled as usual."""
        target, manifest = labels.get(REF), labels.get(CRI_MANIFEST)
        if not target or not manifest:
            return None
        if not (_DIGEST.fullmatch(target) and _DIGEST.fullmatch(manifest)):
            log.warning("ignoring malformed snapshot labels (ref %.80r, manifest %.80r)",
                        target, manifest)
            return None
        try:
            tree = self._tree_for(manifest, labels.get(CRI_IMAGE))
            if tree is None:
                return None
            chains = self._chain_ids(tree)
        except Exception as e:   # noqa: BLE001 - any store failure: a normal pull instead
            log.warning("image %s: converted tree not usable (%s); pulling its layers",
                        labels.get(CRI_IMAGE) or manifest, e)
            return None
        if target not in chains:
            log.warning("tree %s was converted from other layers than %s; pulling them",
                        tree, labels.get(CRI_IMAGE) or manifest)
            return None
        return Match(tree, chains.index(target), len(chains))

    def _tree_for(self, manifest: str, image: str | None) -> str | None:
        from bootseer.errors import BlobNotFound
        from bootseer.image import convert
        from bootseer.store import open_store
        store = open_store(self.config.store.url, self.config)
        tree = store.get_ref(f"images/by-manifest/{manifest.replace(':', '-')}")
        if tree or not image:
            return tree
        try:   # converted under another name: the ref, or the referrer next to the image
            return convert.resolve(image, store, self.config.mount.platform or None)
        except BlobNotFound:
            return None

    def _chain_ids(self, tree: str) -> list[str]:
        if tree not in self._chains:
            from bootseer.store.client import StoreClient
            from bootseer.tree.reader import load_toc
            client = StoreClient.of(self.config)
            with client.lane() as f:
                toc = load_toc(client.store(), tree, f, client.cache)
            self._chains[tree] = list(toc.meta.get("chain_ids") or [])
        return self._chains[tree]

    # -- the top layer's mount ----------------------------------------------------------
    def mount(self, s: Snapshot, fs: str, state: str) -> None:
        """Serve the tree at ``fs`` (prefetching its published profile, recording) from a
        holder process that outlives this one (``snapshotter.holder``)."""
        spec = HolderSpec(self.config, s.labels[TREE], fs, state, self.window_s)
        with self._mounting(s.id):
            try:
                holder = Holder.start(spec)
            except Exception:
                self.counts["mount_failures"] += 1
                raise
            self.counts["mounts_started"] += 1
            with self._lock:
                self._mounts[s.id] = (holder, state)
        r = holder.record
        log.info("snapshot %s: tree %s mounted lazily by holder %d%s", s.key, r.tree, r.pid,
                 f", prefetching {r.hot_chunks} hot chunks" if r.hot_chunks else "")

    def adopt(self, s: Snapshot, state: str) -> bool:
        """Take over the live holder a snapshotter before this one started for ``s``
        (its mount goes on serving untouched); False when there is none."""
        holder = Holder.adopt(state)
        if holder is None:
            return False
        with self._lock:
            self._mounts[s.id] = (holder, state)
        self.counts["mounts_adopted"] += 1
        log.info("snapshot %s: tree %s still served by holder %d (adopted)", s.key,
                 holder.record.tree, holder.pid)
        return True

    def _mounting(self, snapshot_id: int) -> threading.Lock:
        """One mount at a time per snapshot (two Prepares on one image: one holder)."""
        with self._lock:
            return self._mount_locks.setdefault(snapshot_id, threading.Lock())

    def mounted(self, s: Snapshot) -> bool:
        with self._lock:
            entry = self._mounts.get(s.id)
        return entry is not None and entry[0].alive()

    def unmount(self, s: Snapshot) -> None:
        with self._lock:
            entry = self._mounts.pop(s.id, None)
            self._watchers.pop(s.id, None)
            self._mount_locks.pop(s.id, None)
        if entry:
            holder, state = entry
            holder.stop()
            self._retire(state)
            self._publish(state)

    def served(self) -> list[str]:
        """The state directories of the trees served now (their holders alive)."""
        with self._lock:
            entries = list(self._mounts.values())
        return [state for holder, state in entries if holder.alive()]

    def close(self, *, cleanup: bool = False) -> None:
        """Stop watching. The holders go on serving running containers for the next
        snapshotter, unless ``cleanup``: then every tree is unmounted."""
        self._stop.set()
        with self._lock:
            ids = list(self._mounts)
        if cleanup:
            for i in ids:
                self.unmount(Snapshot(key="", id=i, kind=0))
        elif ids:
            log.info("leaving %d image tree(s) served by their holders for the next "
                     "snapshotter", len(ids))

    # -- counters ---------------------------------------------------------------------
    def _retire(self, state: str) -> None:
        """A mount ends: its last counters stay in the totals."""
        last = read_counters(state)
        with self._lock:
            for k, v in last.items():
                self._retired[k] = self._retired.get(k, 0) + v

    def totals(self) -> dict[str, float]:
        """The tree sessions' counters (``counters.json`` in each mount's state), summed
        over the mounts served now and those ended under this snapshotter."""
        with self._lock:
            out = dict(self._retired)
            states = [e[1] for e in self._mounts.values()]
        for state in states:
            for k, v in read_counters(state).items():
                out[k] = out.get(k, 0) + v
        return out

    # -- the recording window -----------------------------------------------------------
    def watch(self, top: Snapshot, upper: str) -> None:
        """A container's upper directory on ``top``: its ready file closes the window."""
        with self._lock:
            self._watchers.setdefault(top.id, []).append(upper)

    def forget(self, upper: str) -> None:
        """A container's snapshot goes: a last look at its ready file (a job that touched
        it and exited at once is seen here, not only by the watcher's poll)."""
        with self._lock:
            items = [(i, u) for i, u in self._watchers.items() if upper in u]
        for top_id, uppers in items:
            self._check_ready(top_id, [upper])
            with self._lock:
                if upper in uppers:
                    uppers.remove(upper)

    def _check_ready(self, top_id: int, uppers: list[str]) -> None:
        from bootseer.tree.session import TRIGGER
        with self._lock:
            entry = self._mounts.get(top_id)
        if entry is not None and any(os.path.exists(os.path.join(u, self.ready_file))
                                     for u in uppers):
            open(os.path.join(entry[1], TRIGGER), "a").close()

    def _watch(self) -> None:
        published: set[str] = set()
        while not self._stop.wait(0.2):
            with self._lock:
                items = [(i, list(u)) for i, u in self._watchers.items()]
            for top_id, uppers in items:
                self._check_ready(top_id, uppers)
            with self._lock:
                states = [e[1] for e in self._mounts.values()]
            for state in states:   # a closed window's profile goes out at once
                if state not in published and os.path.exists(os.path.join(state, "figures.json")):
                    published.add(state)
                    self._publish(state)

    def _publish(self, state: str) -> None:
        from bootseer.tree import profile as prof
        figures = os.path.join(state, "figures.json")
        done = os.path.join(state, "published")
        if not os.path.exists(figures) or os.path.exists(done):
            return
        try:
            with open(figures) as f:
                fig = json.load(f)
            digest = prof.publish_recorded(self.config, os.path.join(state, "profile.json"))
            log.info("start of tree %s: coverage %s, %s chunks read, stall %s s; profile %s",
                     fig.get("tree"), fig.get("coverage"), fig.get("read_chunks"),
                     fig.get("stall_s"), digest or "not published")
            open(done, "w").close()
        except (OSError, ValueError) as e:
            log.warning("cannot publish the recorded profile in %s: %s", state, e)
