"""Checkpoint files through the job's peers: data-parallel replicas read the same shards,
so a job of N nodes needs them from the origin about once, not N times.

A checkpoint file is not content-addressed like the store's chunks: its identity is its
URL, size and mtime/ETag. What peers exchange are its stripes (``ckpt.stripe_bytes``, the
unit the engine stages), each named by its sha256 in a **manifest** (per file: identity,
size, stripe digests) kept as a blob under the store ref ``peers/ckpt/<key>`` (the key
names the files' identities and the stripe size). With a manifest a checkpoint is a set
like an image's hot set and travels the same way (bootseer.peers.transfer): one torrent, the
origin's part dealt among the nodes by rendezvous hashing, the rest from the peers, and
every stripe checked against its digest before it is staged, where the engine finds it.

The manifest needs the bytes. One node of the job (chosen alike by every node when the
roster lists exactly the job's nodes, else the first to claim the key for the job's
attempt) reads them from the origin as without peers, hashes
each stripe, makes and publishes the torrent and the manifest, and seeds; meanwhile the
others' demand reads go to the origin as ever and they wait for the manifest (at most
``peers.wait_s``), then take the rest from the maker and each other. Later starts on the
same files (a restart, the update-debug loop) find the manifest and share the origin's
work from the first byte.

Trust: a manifest is made by a node of the job from bytes it read from the origin and kept
in the store, like a recorded access profile; it is checked to describe exactly the files
being loaded. A stripe from a peer passes libtorrent's v2 piece check and then its digest
(a lying peer is banned and the stripe comes from the origin).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from bootseer.errors import DigestMismatch, InvalidDigest
from bootseer.peers import job_of, roster, share_for
from bootseer.peers import wanted as peers_wanted
from bootseer.peers.source import SetItem
from bootseer.store import open_store
from bootseer.store.digest import parse, sha256_digest, verify
from bootseer.store.fetch import Priority

if TYPE_CHECKING:   # the transfer imports libtorrent, an optional extra
    from bootseer.peers.transfer import SetTransfer

log = logging.getLogger(__name__)

NAMESPACE = "ckpt"        # its own swarm: never mixed with an image's or an environment's
KIND = "bootseer.peers.ckpt-manifest"
ORIGIN_BATCH = 8          # stripes the peers left over are fetched this many at a time
SEED_HEADROOM_BYTES = 1 << 30   # the seed copy must fit with this much disk left over


def manifest_key(sources, stripe_bytes: int) -> str:
    """The key of a checkpoint's files (their identities) cut in ``stripe_bytes``."""
    text = "\n".join(sorted(s.key for s in sources)) + f"\nstripe {stripe_bytes}"
    return sha256_digest(text.encode()).split(":", 1)[1]


def manifest_ref(key: str) -> str:
    return f"peers/ckpt/{key}"


def wanted(config, total_bytes: int) -> bool:
    """Whether peers apply to a checkpoint of ``total_bytes`` (before any swarm is made):
    the set is wanted, and there is a store to keep its manifest in."""
    return bool(config.store.url) and peers_wanted(config.peers, total_bytes)


class Stripes:
    """The stripes of a checkpoint's files as a set's source (``bootseer.peers.source``):
    origin fetches go through the engine's fetcher, verified stripes are written into the
    engine's staging copies, so a reader finds them staged. Items are in file and stripe
    order, each digest once (a stripe repeated is written to every place it holds)."""

    def __init__(self, engine, files: list, digests: list[list[str]]):
        self.engine, self.files = engine, files
        self.places: dict[str, list[tuple]] = {}
        self.items: list[SetItem] = []
        for f, stripes in zip(files, digests, strict=True):
            for idx, digest in enumerate(stripes):
                start, end = f.staged.span(idx)
                if digest not in self.places:
                    self.items.append(SetItem(digest, end - start, end - start))
                self.places.setdefault(digest, []).append((f, idx))

    def staged(self, digest: str) -> bool:
        return all(f.staged.has(idx) for f, idx in self.places[digest])

    def read_staged(self, digest: str) -> bytes:
        f, idx = next((f, i) for f, i in self.places[digest] if f.staged.has(i))
        start, end = f.staged.span(idx)
        return f.staged.pread(start, end - start)

    def local_path(self, digest: str):
        return None   # a stripe is part of a file: the seed copy gets its bytes instead

    def stage(self, digest: str, data: bytes) -> None:
        for f, idx in self.places.get(digest, ()):
            if not f.staged.has(idx):
                f.staged.write(idx, data)

    def submit(self, items: list[SetItem]) -> list:
        ranges = []
        for item in items:
            f, idx = self.places[item.digest][0]
            ranges.append((f.source, *f.staged.span(idx)))
        return self.engine.fetcher.submit_many(ranges, priority=Priority.PREFETCH)

    def accept_origin(self, item: SetItem, raw: bytes) -> bytes:
        """A stripe from the origin: checked against the manifest (the file may have
        changed since it was made: then the engine's own reads say so), then staged."""
        verify(item.digest, raw, source="the checkpoint's origin")
        self.stage(item.digest, raw)
        return raw

    def accept_peer(self, item: SetItem, data: bytes) -> None:
        self.stage(item.digest, data)


def read_manifest(store, key: str, files: list) -> list[list[str]] | None:
    """The stripe digests of ``files`` from the store's manifest ``key``, or None (none
    published, or one that does not describe exactly these files: logged, ignored)."""
    digest = store.get_ref(manifest_ref(key))
    if digest is None:
        return None
    try:
        data = store.read(digest)
        verify(digest, data, source=getattr(store, "url", ""))
        doc = json.loads(data)
        return _digests_of(doc, files)
    except (ValueError, KeyError, TypeError, DigestMismatch, InvalidDigest) as e:
        log.warning("peers: checkpoint manifest %s is unusable (%s): origin only", key[:12], e)
        return None


def _digests_of(doc, files: list) -> list[list[str]]:
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("v") != 1:
        raise ValueError("not a version 1 checkpoint manifest")
    entries = doc["files"]
    if len(entries) != len(files):
        raise ValueError("it lists other files")
    out = []
    for f, e in zip(files, entries, strict=True):
        n = math.ceil(f.size / f.S) if f.size else 0
        stripes = e["stripes"]
        if (e["key"] != f.source.key or e["size"] != f.size or doc["stripe_bytes"] != f.S
                or len(stripes) != n):
            raise ValueError(f"it does not describe {f.source.key.split('|')[0]}")
        for d in stripes:
            parse(d)   # InvalidDigest: a ValueError
        out.append(list(stripes))
    return out


def _manifest(files: list, digests: list[list[str]]) -> bytes:
    doc = {"v": 1, "kind": KIND, "stripe_bytes": files[0].S if files else 0,
           "files": [{"key": f.source.key, "size": f.size, "stripes": d}
                     for f, d in zip(files, digests, strict=True)]}
    return json.dumps(doc, separators=(",", ":")).encode()


class Figures(TypedDict):
    """What a checkpoint load through peers did, for its load report."""
    peers_role: str | None   # maker, peer, origin (None until known)
    peer_bytes: int
    origin_bytes: int
    peers_seen: int
    peers_banned: int
    peers_seconds: NotRequired[float]


class CheckpointPeers:
    """One checkpoint load's files through the job's peers on this node."""

    def __init__(self, config, engine, sources, share, store, stage):
        self.config, self.engine, self.share, self.store = config, engine, share, store
        self.stage = stage   # the maker's fetch of whole files from the origin
        self.files = [engine.file(s) for s in sorted(sources, key=lambda s: s.key)]
        self.key = manifest_key([f.source for f in self.files], engine.config.stripe_bytes)
        self.figures: Figures = {"peers_role": None, "peer_bytes": 0, "origin_bytes": 0,
                                 "peers_seen": 0, "peers_banned": 0}
        self.transfer: SetTransfer | None = None

    def _maker_ref(self) -> str:
        return f"peers/{self.share.group}/ckpt-maker/{self.share.attempt}/{self.key}"

    def run(self, stop: threading.Event) -> dict:
        """Stage every stripe (peers first, the origin for what they do not bring) and
        keep seeding them; returns the figures for the load report."""
        t0 = time.monotonic()
        digests = read_manifest(self.store, self.key, self.files)
        if digests is None:
            if self._am_maker():
                self._make(stop)
                return self._done(t0)
            digests = self._await_manifest(stop)
            if digests is None:
                self.figures["peers_role"] = "origin"
                log.info("peers: no manifest for checkpoint %s after %.0fs: origin",
                         self.key[:12], self.share.settings.wait_s)
                return self._done(t0)
        stripes = Stripes(self.engine, self.files, digests)
        stats: dict = {}
        transfer = self.transfer = self.share.open_set(stripes.items, stripes, stats)
        for item in stripes.items:   # what this node staged before is seeded, not fetched
            if stripes.staged(item.digest):
                transfer.offer(item.digest, stripes.read_staged(item.digest))
        left = transfer.fetch(stop)
        self.figures["peers_role"] = self.share.stats["role"]
        self.figures["peer_bytes"] = stats.get("peer_bytes", 0)
        self.figures["origin_bytes"] = stats.get("origin_bytes", 0)
        self._origin_rest(stripes, left, transfer, stop)
        return self._done(t0)

    def _am_maker(self) -> bool:
        """Whether this node makes the manifest. When the roster lists exactly the job's
        nodes, every node picks the same one without a claim (on a registry an exclusive
        claim waits a settle time, a second): the node whose hash with the key is highest;
        it still marks the claim at once, so a node that saw the roster incomplete and
        claims finds it taken. Otherwise (a late or a stale announcement) the first claim."""
        share = self.share
        nodes = share.settings.nodes
        if nodes >= 2:
            share.await_members(nodes)
            addrs = [f"{ip}:{port}" for ip, port in share.swarm.endpoints()]
            addrs.append(share.swarm.addr)
            if len(addrs) == nodes:
                chosen = max(addrs, key=lambda a: sha256_digest(f"{a} {self.key}".encode()))
                if chosen == share.swarm.addr:
                    self.store.set_ref(self._maker_ref(), share.announcement)
                return chosen == share.swarm.addr
        return self.store.set_ref(self._maker_ref(), share.announcement, exclusive=True)

    def _done(self, t0: float) -> dict:
        self.figures["peers_seen"] = self.share.stats["peers"]
        self.figures["peers_banned"] = len(self.share.stats["banned"])
        self.figures["peers_seconds"] = round(time.monotonic() - t0, 3)
        return dict(self.figures)

    def _await_manifest(self, stop: threading.Event):
        """The maker's manifest, once published; None after ``wait_s``, or sooner when the
        maker is gone (``roster.ClaimWatch``)."""
        deadline = time.monotonic() + self.share.settings.wait_s
        maker = roster.ClaimWatch(self.store, self._maker_ref())
        while time.monotonic() < deadline and not stop.wait(0.1):
            digests = read_manifest(self.store, self.key, self.files)
            if digests is not None:
                return digests
            if maker.gone():
                log.warning("peers: the maker of checkpoint %s is gone: origin", self.key[:12])
                return None
        return None

    def _origin_rest(self, stripes: Stripes, left: list[SetItem], transfer: SetTransfer,
                     stop: threading.Event) -> None:
        """What the peers did not bring: from the origin, verified, staged and seeded."""
        for i in range(0, len(left), ORIGIN_BATCH):
            if stop.is_set():
                return
            batch = [it for it in left[i:i + ORIGIN_BATCH] if not stripes.staged(it.digest)]
            for item, fut in zip(batch, stripes.submit(batch), strict=True):
                try:
                    data = stripes.accept_origin(item, fut.result())
                except Exception as e:  # noqa: BLE001 - the engine's reads fetch it again
                    log.info("peers: checkpoint stripe %s from the origin failed: %s",
                             item.digest[:19], e)
                    continue
                self.figures["origin_bytes"] += len(data)
                transfer.offer(item.digest, data)

    def _make(self, stop: threading.Event) -> None:
        """The maker: every file from the origin through the engine, each stripe hashed,
        the torrent made and seeded, the manifest published (last: its presence says the
        torrent is there to join)."""
        self.figures["peers_role"] = "maker"
        t0 = time.monotonic()
        before = self.engine.fetcher.counters()["bytes"]
        pre = self.stage([f.source for f in self.files])
        while not pre.join(0.2):
            if stop.is_set():
                pre.stop()
                return
        self.figures["origin_bytes"] = self.engine.fetcher.counters()["bytes"] - before
        if not all(f.staged.complete for f in self.files):
            log.info("peers: checkpoint %s not wholly fetched: no manifest made", self.key[:12])
            return
        t_fetched = time.monotonic()
        digests = [[sha256_digest(f.staged.pread(*_extent(f, idx)))
                    for idx in range(f.staged.nstripes)] for f in self.files]
        stripes = Stripes(self.engine, self.files, digests)
        transfer = self.transfer = self.share.open_set(stripes.items, stripes, {})
        for item in stripes.items:
            transfer.offer(item.digest, stripes.read_staged(item.digest))
        if not transfer.finish():
            return
        blob = _manifest(self.files, digests)
        digest = sha256_digest(blob)
        self.store.write(digest, blob)
        self.store.set_ref(manifest_ref(self.key), digest)
        log.info("peers: checkpoint %s: fetched in %.2fs, hashed, seeded and published in "
                 "%.2fs", self.key[:12], t_fetched - t0, time.monotonic() - t_fetched)


def _free_bytes(path) -> int:
    path = Path(path)
    while not path.exists():   # the seed directory is made on first use
        path = path.parent
    return shutil.disk_usage(path).free


def _extent(f, idx: int) -> tuple[int, int]:
    start, end = f.staged.span(idx)
    return start, end - start


def fetch_checkpoint(config, engine, sources, stage, stop: threading.Event | None = None
                     ) -> dict | None:
    """Stage the checkpoint files ``sources`` through the job's peers (see the module
    doc); ``stage(sources)`` starts the engine's fetch of whole files from the origin (a
    ``ckpt.prefetch.Prefetch``: ``join``, ``stop``), which the maker of a manifest needs
    (passed in: the plan's prefetch is what starts this). Returns the figures for the load
    report (``peers_role``, ``peer_bytes``, ``origin_bytes``, ``peers_seen``,
    ``peers_banned``, ``peers_seconds``), or None when peers do not apply (then nothing was
    fetched). Never raises: peers only cost time."""
    sources = list(sources)
    if not sources or not wanted(config, sum(s.size for s in sources)):
        return None
    if not job_of(config):
        log.info("peers: no job id (BOOTSEER_PEERS_JOB_ID or BOOTSEER_TRACE_JOB_ID): "
                 "checkpoint from the origin")
        return None
    try:
        store = open_store(config.store.url, config)
        share = share_for(config, store, NAMESPACE)
        if share is None:
            return None
        total = sum(s.size for s in sources)
        free = _free_bytes(share.work_dir)
        if free < total + SEED_HEADROOM_BYTES:
            log.warning("peers: the seed copy of the checkpoint (%d bytes) does not fit in "
                        "%s (%d bytes free): checkpoint from the origin", total,
                        share.work_dir, free)
            return None
        return CheckpointPeers(config, engine, sources, share, store, stage).run(
            stop or threading.Event())
    except Exception as e:   # the engine's plan prefetch brings the rest
        log.warning("peers: checkpoint through peers failed (%s): origin for the rest", e)
        log.debug("peers: checkpoint failure", exc_info=True)
        return None
