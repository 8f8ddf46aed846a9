"""A hot set shared among the nodes of one job.

The first node to ask for a set (an exclusive per-job ref) fetches it from the origin like
any node, then makes the set's torrent, publishes it to the store and seeds. The others
wait for the torrent, fetch the set from the job's peers, and fall back to the origin for
whatever peers do not deliver (no peer reachable, a peer gone mid-transfer, no progress for
``stall_s``). Every chunk from peers goes through the same check as a chunk from the store
(``deliver``: decompress, sha256 against the digest, then the node cache); libtorrent's v2
piece hashes are a second check that lets it ban a lying peer early. Chunks fetched from the
origin are handed to libtorrent too, so every node seeds what it has.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import shutil
import socket
import struct
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import libtorrent as lt

from bootseer.peers import roster
from bootseer.peers.swarm import Swarm
from bootseer.peers.torrent import file_name, load_torrent, make_torrent, set_key, torrent_name
from bootseer.store.digest import sha256_digest, verify

log = logging.getLogger(__name__)


def torrent_ref(key: str) -> str:
    return f"peers/torrents/{key}"


class PeerShare:
    """Peers for hot sets on this node: one swarm, refreshed from the job's roster."""

    def __init__(self, store, swarm: Swarm, job: str, node: str, work_dir: str, *,
                 stall_s: float = 5.0, wait_s: float = 120.0, refresh_s: float = 1.0,
                 attempt: int = 0):
        self.store, self.swarm, self.job, self.node = store, swarm, job, node
        self.attempt = attempt   # a restart of the job has its own maker
        self.work_dir = Path(work_dir)
        remove_unused_sets(self.work_dir)
        self.stall_s, self.wait_s, self.refresh_s = stall_s, wait_s, refresh_s
        self.announcement = roster.announce(store, job, node, swarm.addr)
        self.handles: list = []
        self.min_set_bytes = 0   # smaller sets are not worth a torrent (share_for sets it)
        self.stats = {"role": None, "peer_chunks": 0, "peer_bytes": 0, "rejected": 0,
                      "banned": [], "peers": 0, "seconds": 0.0}
        self._stop = threading.Event()
        threading.Thread(target=self._follow, daemon=True, name="bootseer-peers").start()

    # -- the roster ---------------------------------------------------------------------------
    def _connect_members(self, handle=None) -> None:
        """Admit the roster; connect every torrent to nodes new to this one, and
        ``handle`` (a torrent just added) to all. Connecting again to a connected node
        only makes both sides drop a duplicate connection."""
        found = roster.members(self.store, self.job)
        self.stats["peers"] = len([a for a in found.values() if a != self.swarm.addr])
        # Downloaders connect out, seeds wait to be called: two nodes calling each other
        # at once drop both calls (duplicate peer id) and lose a second.
        for ep in self.swarm.admit(found.values()):
            for h in list(self.handles):
                if h != handle and not h.status().is_seeding:
                    h.connect_peer(ep)
        if handle is not None:
            deadline = time.monotonic() + 5   # called while checking, a peer hangs up
            while (handle.status().state in (lt.torrent_status.checking_files,
                                             lt.torrent_status.checking_resume_data)
                   and time.monotonic() < deadline):
                time.sleep(0.01)
            for ep in self.swarm.endpoints():
                handle.connect_peer(ep)

    def _follow(self) -> None:
        """Admit (and connect to) nodes that join later."""
        while not self._stop.wait(self.refresh_s):
            try:
                self._connect_members()
            except Exception as e:  # noqa: BLE001 - sharing never fails the node
                log.info("peers: roster refresh failed: %s", e)

    # -- one set ------------------------------------------------------------------------------
    def open_set(self, refs: list[list]) -> "SetTransfer":
        return SetTransfer(self, refs)

    def close(self) -> None:
        self._stop.set()
        self.swarm.close()


class SetTransfer:
    """The transfer of one set on this node (``refs``: tree chunk refs, digest first and
    the stored size fourth)."""

    def __init__(self, share: PeerShare, refs: list[list]):
        self.share = share
        self.refs = {file_name(r[0]): r for r in refs}
        self.items = sorted({(r[0], r[3]) for r in refs})
        self.key = set_key(self.items)
        self.dir = share.work_dir / self.key
        self._lock = hold_set(self.dir)   # while this process lives, nobody removes it
        self.files = self.dir / torrent_name(self.key)
        self.handle = None
        self.ti = None
        self._names: list[str] = []
        self.layout: dict[str, tuple[int, int]] = {}
        self.delivered: set[str] = set()
        self._stop = threading.Event()

    def summary(self) -> dict:
        """Flat figures for the trace (prefetch attributes of ``image.window``)."""
        st = self.share.stats
        return {"peers_role": st["role"], "peers_seen": st["peers"],
                "peers_banned": len(st["banned"]), "peers_rejected": st["rejected"],
                "peers_seconds": round(st["seconds"], 3)}

    def _maker_ref(self) -> str:
        return f"peers/{self.share.job}/maker/{self.share.attempt}/{self.key}"

    def _torrent(self, wait_s: float):
        store = self.share.store
        deadline = time.monotonic() + wait_s
        while True:
            digest = store.get_ref(torrent_ref(self.key))
            if digest is not None:
                data = store.read(digest)
                verify(digest, data, source=getattr(store, "url", ""))
                return load_torrent(data, self.items)
            if time.monotonic() >= deadline or self._stop.wait(0.1):
                return None

    def fetch(self, deliver, stop: threading.Event | None = None) -> list[list]:
        """Bring the set from peers; ``deliver(ref, raw)`` verifies and caches one chunk
        (raises on a bad one); ``stop`` ends it early. Returns the refs left for the
        origin."""
        self._stop = stop or self._stop
        share, stats = self.share, self.share.stats
        t0 = time.monotonic()
        try:
            # One node per job takes the set from the origin and seeds it. A torrent from
            # an earlier job says nothing about who has the bytes now; but with it, the
            # maker seeds each chunk as it arrives instead of after the whole set.
            if share.store.set_ref(self._maker_ref(), share.announcement, exclusive=True):
                stats["role"] = "maker"
                ti = self._torrent(0)
                if ti is not None:
                    self._attach(ti)
                    self.handle.prioritize_files([0] * len(self._names))   # offer() feeds it
                return list(self.refs.values())
            ti = self._torrent(share.wait_s)
            if ti is None:
                stats["role"] = "origin"
                log.info("peers: no torrent for set %s after %.0fs: origin", self.key[:12],
                         share.wait_s)
                return list(self.refs.values())
            stats["role"] = "peer"
            self._attach(ti)
            self._download(deliver)
        except Exception as e:  # noqa: BLE001 - peers only cost time, the origin is there
            log.warning("peers: set %s: %s; the rest comes from the origin", self.key[:12], e)
        finally:
            stats["seconds"] += time.monotonic() - t0
        left = [r for name, r in self.refs.items() if name not in self.delivered]
        if self.handle is not None and left:
            # the origin brings these (and offer() hands them over): no second copy
            wanted = {file_name(r[0]) for r in left}
            self.handle.prioritize_files([0 if name in wanted else 4
                                          for name in self._names])
        return left

    def _attach(self, ti) -> None:
        """Add the torrent to the swarm; note where each item lies (v2 torrents align
        every file to a piece with pad files, which are no item)."""
        self.files.mkdir(parents=True, exist_ok=True)
        self.ti, fs, plen = ti, ti.layout(), ti.piece_length()
        self._names, self.layout = [], {}
        for i in range(fs.num_files()):
            name = os.path.basename(fs.file_path(i))
            self._names.append(name)
            if fs.file_flags(i) & fs.flag_pad_file:
                continue
            first, size = fs.piece_index_at_file(i), fs.file_size(i)
            self.layout[name] = (first, max(1, -(-size // plen)))
        self.handle = self.share.swarm.add(ti, str(self.dir))
        self.share.handles.append(self.handle)
        self.share._connect_members(self.handle)

    def _download(self, deliver) -> None:
        """Until every item is delivered, or peers make no progress for ``stall_s``.
        Pieces are read back through libtorrent (its disk cache may not have written
        them to the file yet)."""
        share, h = self.share, self.handle
        piece_of = {p: name for name, (first, n) in self.layout.items()
                    for p in range(first, first + n)}
        got: dict[int, bytes] = {}
        asked: set[int] = set()
        last_done, last_progress, last_roster = -1, time.monotonic(), time.monotonic()
        while len(self.delivered) < len(self.refs) and not self._stop.is_set():
            share.swarm.check_peers(h)
            for a in share.swarm.alerts():   # also notes bans
                if isinstance(a, lt.read_piece_alert) and a.handle == h:
                    if a.error.value():
                        asked.discard(a.piece)
                    else:
                        got[a.piece] = bytes(a.buffer)
            for p, have in enumerate(h.status(lt.torrent_handle.query_pieces).pieces):
                if have and p in piece_of and p not in asked:
                    asked.add(p)
                    h.read_piece(p)
            for name, (first, n) in self.layout.items():
                if name not in self.delivered and all(first + k in got for k in range(n)):
                    raw = b"".join(got.pop(first + k) for k in range(n))
                    self._take(name, raw, deliver)
            done = h.status().total_payload_download   # partial pieces count as progress
            now = time.monotonic()
            if done != last_done:
                last_done, last_progress = done, now
            elif share.swarm.banned and not share.swarm.endpoints():
                log.info("peers: every peer of set %s is banned: origin for the rest",
                         self.key[:12])
                break
            elif now - last_progress > share.stall_s:
                log.info("peers: no progress for %.1fs on set %s: origin for the rest",
                         share.stall_s, self.key[:12])
                break
            if now - last_roster > share.refresh_s:
                share._connect_members()
                if h.status().num_peers == 0:   # refused calls are retried late: call again
                    for ep in share.swarm.endpoints():
                        h.connect_peer(ep)
                last_roster = now
            time.sleep(0.05)
        share.stats["banned"] = sorted(share.swarm.banned)

    def _take(self, name: str, raw: bytes, deliver) -> None:
        ref = self.refs[name]
        try:
            deliver(ref, raw)
        except Exception as e:  # noqa: BLE001 - a bad chunk is refetched from the origin
            self.share.stats["rejected"] += 1
            log.warning("peers: chunk %s from peers failed verification (%s): refetched from "
                        "the origin", ref[0], e)
            raise RuntimeError(f"torrent of set {self.key[:12]} serves chunk {ref[0]} "
                               f"that fails its digest") from e
        self.delivered.add(name)
        self.share.stats["peer_chunks"] += 1
        self.share.stats["peer_bytes"] += len(raw)

    # -- what the origin brought --------------------------------------------------------------
    def offer(self, ref: list, raw: bytes) -> None:
        """A verified chunk from the origin: kept so this node seeds it."""
        name = file_name(ref[0])
        if name not in self.refs or name in self.delivered:
            return
        if self.handle is not None:
            first, _ = self.layout[name]
            plen = self.ti.piece_length()
            for k in range(0, max(len(raw), 1), plen):
                self.handle.add_piece(first + k // plen, raw[k:k + plen], 0)
            return
        self.files.mkdir(parents=True, exist_ok=True)
        tmp = self.files / f".{name}.tmp"
        tmp.write_bytes(raw)
        os.replace(tmp, self.files / name)

    def finish(self) -> bool:
        """After the origin fetch of a node without the torrent: make, publish and seed it.
        Needs every chunk of the set here; returns whether this node seeds."""
        if self.handle is not None:
            return True
        if not all((self.files / n).is_file() for n in self.refs):
            return False
        store = self.share.store
        data = make_torrent(str(self.dir), self.items)
        # Seed first, then publish: a node that finds the torrent calls at once, and a
        # call refused for an unknown torrent is retried only a minute later.
        self._attach(load_torrent(data, self.items))
        digest = sha256_digest(data)
        store.write(digest, data)
        store.set_ref(torrent_ref(self.key), digest, exclusive=True)   # made alike anywhere
        return True


# -- the node's copies for seeding ------------------------------------------------------------
# A copy lives as long as a process seeds it: each holds a shared lock on ``<key>.lock``
# beside it (released when the process dies, however), and a new share removes the copies
# nobody holds, so the disk holds the sets in use and no more.
def hold_set(directory: Path):
    directory.parent.mkdir(parents=True, exist_ok=True)
    f = open(f"{directory}.lock", "a")
    fcntl.flock(f, fcntl.LOCK_SH)
    return f


def remove_unused_sets(work_dir: Path) -> None:
    if not work_dir.is_dir():
        return
    for lock in work_dir.glob("*.lock"):
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue   # seeded by a live process
            # the lock file stays (a few bytes): unlinked, a process blocked on it
            # would hold a lock nobody else sees
            shutil.rmtree(lock.with_suffix(""), ignore_errors=True)


# -- this node's address ----------------------------------------------------------------------
def _device_ip(name: str) -> str:
    SIOCGIFADDR = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def node_ip(interface: str | None, store_url: str) -> str:
    """The address peers reach this node at: ``interface`` (an address or a device name),
    else the one this node routes to the store from (no packet is sent)."""
    if interface:
        try:
            return str(ipaddress.IPv4Address(interface))
        except ValueError:
            return _device_ip(interface)
    host = urlsplit(store_url).hostname if "://" in store_url else None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host or "192.0.2.1", 9))   # TEST-NET: a route, never a packet
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())
