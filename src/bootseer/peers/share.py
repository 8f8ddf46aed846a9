"""A hot set shared among the nodes of one job.

The set's torrent is made once, where the set is published (``bootseer.peers.publish``:
the recording node when it pushes the profile, the builder of an environment snapshot).
On a start every node finds it at once, links the chunks its node cache already holds into
its seed copy, joins the swarm, and from then on takes each chunk from whichever source
comes first: its share of the set from the origin (the set is cut into segments, and the
segments are dealt out among the job's nodes), the rest from the peers that fetched theirs.
Nobody waits for anybody's whole fetch; a chunk some peer already has is not fetched from the
origin; a node that is gone (or never came) has its segments dealt to the others.

A set with no published torrent (a profile pushed before peers, a first restore) falls back
to one maker per job: it fetches the set from the origin, makes and publishes the torrent and
seeds; the others wait for it.

Trust: the torrent's files hold the chunks as the node cache holds them (uncompressed), so
every chunk from a peer is checked by its sha256 against its digest before it enters the
cache; libtorrent's v2 piece hashes are a second check that lets it ban a lying peer early.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import logging
import os
import queue
import shutil
import socket
import struct
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from urllib.parse import urlsplit

import libtorrent as lt

from bootseer.peers import roster
from bootseer.peers.swarm import PIECE_DONE, Swarm
from bootseer.peers.torrent import (file_name, layout, load_torrent, make_torrent, put_member,
                                    set_items, set_key, torrent_name)
from bootseer.store.digest import sha256_digest, verify
from bootseer.store.fetch import Priority

log = logging.getLogger(__name__)

SEGMENT_BYTES = 1 << 20     # the unit of the origin's work dealt to nodes (coalesced reads)
ORIGIN_WINDOW = 4 << 20     # origin bytes in flight per node: small, so a new view applies fast
JOIN_GRACE_S = 1.0          # how long an announced node not connected yet keeps its share of
                            # the origin's segments (one learned by its knock calls back
                            # within a second)
JOIN_WAIT_S = 0.3           # at join, how long to look for the job's other nodes announcing
RECALL_S = 2.0              # a node not connected to an announced peer calls it again this often
REDIAL_S = 0.25             # ... and this often while it is connected to nobody
TICK_S = 0.1                # how often libtorrent's state is asked for (peers, availability)
EVENT_BATCH = 256           # piece events handled between two looks at the time
ORIGIN_DONE = "origin"      # an event of the set's queue: an origin fetch is done


def torrent_ref(key: str) -> str:
    return f"peers/torrents/{key}"


class PeerShare:
    """Peers for sets on this node: one swarm; the roster read when this node joins and
    again only when an unknown node calls (a knock: it joined later)."""

    def __init__(self, store, swarm: Swarm, job: str, node: str, work_dir: str, *,
                 stall_s: float = 5.0, wait_s: float = 120.0, attempt: int = 0,
                 nodes: int = 0, refresh_s: float = 0.05):
        self.store, self.swarm, self.job, self.node = store, swarm, job, node
        self.attempt = attempt   # a restart of the job has its own maker
        self.nodes = nodes   # the job's size (0: unknown)
        self.work_dir = Path(work_dir)
        remove_unused_sets(self.work_dir)
        self.stall_s, self.wait_s, self.refresh_s = stall_s, wait_s, refresh_s
        self.announcement = roster.announce(store, job, node, swarm.addr)
        self.handles: list = []
        self.min_set_bytes = 0   # smaller sets are not worth a torrent (share_for sets it)
        self.roster_reads = 0
        self.stats = {"role": None, "peer_chunks": 0, "peer_bytes": 0, "rejected": 0,
                      "banned": [], "peers": 0, "seconds": 0.0}
        self._stop = threading.Event()
        self._roster_lock = threading.Lock()
        self.read_roster()
        threading.Thread(target=self._learn, daemon=True, name="bootseer-peers").start()

    # -- the roster ---------------------------------------------------------------------------
    def read_roster(self) -> list[tuple[str, int]]:
        """Admit the job's announced nodes; call the new ones from every torrent (they
        called this node and were refused, or will find it seeding). Returns the new."""
        with self._roster_lock:
            found = roster.members(self.store, self.job)
            self.roster_reads += 1
            self.stats["peers"] = len([a for a in found.values() if a != self.swarm.addr])
            new = self.swarm.admit(found.values())
        for ep in new:
            for h in list(self.handles):
                h.connect_peer(ep)
        return new

    def await_members(self, nodes: int, wait_s: float = JOIN_WAIT_S) -> None:
        """At join: read the roster until the job's ``nodes`` have announced (nodes that
        start at once), for ``wait_s`` at most; the torrent is added after, so its first
        calls (made at once; later calls wait for libtorrent's next round, up to a second)
        reach nodes that know this one. Later nodes are learned by their knocks."""
        deadline = time.monotonic() + wait_s
        while (self.stats["peers"] + 1 < nodes and time.monotonic() < deadline
               and not self._stop.wait(0.05)):
            self.read_roster()

    def _learn(self) -> None:
        """A knock (a call from an address not admitted) means a node joined after this one
        read the roster: read it again, at most every ``refresh_s``; not when every knocker
        was admitted meanwhile (nodes started together call each other before they have
        all read the roster, which each then reads anyway)."""
        while not self._stop.is_set():
            if not self.swarm.knocked.wait(1.0):
                continue
            time.sleep(self.refresh_s)   # knocks come in bursts: one read for all of them
            self.swarm.knocked.clear()
            if not self.swarm.take_knocks():
                continue
            try:
                self.read_roster()
            except Exception as e:  # noqa: BLE001 - sharing never fails the node
                log.info("peers: roster read failed: %s", e)

    # -- one set ------------------------------------------------------------------------------
    def open_set(self, refs: list[list], reader=None, stats: dict | None = None) -> "SetTransfer":
        return SetTransfer(self, refs, reader, stats)

    def close(self) -> None:
        self._stop.set()
        self.swarm.close()


class SetTransfer:
    """The transfer of one set on this node (``refs``: tree chunk refs, digest first, stored
    size fourth, size fifth). ``reader`` (a TreeReader) fetches from the origin, verifies
    and caches; ``stats`` (the prefetch figures) are counted as chunks arrive."""

    def __init__(self, share: PeerShare, refs: list[list], reader=None,
                 stats: dict | None = None):
        self.share, self.reader = share, reader
        self.cache = getattr(reader, "cache", None)
        self.refs = {file_name(r[0]): r for r in refs}
        self.items = set_items(refs)
        self.key = set_key(self.items)
        self.tfiles = layout(self.items)   # the torrent's files: large items, bundles
        self.file_of = {file_name(m.digest): (f, m) for f in self.tfiles for m in f.members}
        self.dir = share.work_dir / self.key
        self._lock = hold_set(self.dir)   # while this process lives, nobody removes it
        self.files = self.dir / torrent_name(self.key)
        self.stats = stats if stats is not None else {}
        for k in ("fetched_chunks", "fetched_bytes", "origin_bytes", "peer_bytes",
                  "already_local"):
            self.stats.setdefault(k, 0)
        self.handle = None
        self.ti = None
        self._names: list[str] = []   # the torrent's file names by index (pad files too)
        self.layout: dict[str, tuple[int, int]] = {}   # item -> (first piece, pieces)
        self._piece_items: dict[int, list[str]] = {}   # piece -> the items in it
        self._parts: dict[str, dict[str, bytes]] = {}   # bundle -> its members here so far
        self._on_disk: set[str] = set()   # items in the seed copy before the torrent exists
        self.delivered: set[str] = set()
        self.prefetched: set[str] = set()   # digests this transfer put in the cache
        self._stop = threading.Event()
        self._have: set[int] = set()   # pieces libtorrent has (passed their hash here)
        self._avail, self._busy = None, set()   # who has what, as the last tick saw it
        self._t_called = 0.0   # when the announced nodes were called (after attaching)
        self._window = ORIGIN_WINDOW   # origin bytes in flight at most, now
        # Segments: runs of the torrent's files (set order, i.e. pack order, so a node's
        # origin reads coalesce; a bundle never split), dealt out to nodes for the origin.
        self.segments: list[list[str]] = []
        cur: list[str] = []
        size = 0
        for f in self.tfiles:
            if cur and size + f.size > SEGMENT_BYTES:
                self.segments.append(cur)
                cur, size = [], 0
            cur.extend(file_name(m.digest) for m in f.members)
            size += f.size
        if cur:
            self.segments.append(cur)
        self._segment_hashes = [_hash(seg[0]) for seg in self.segments]

    def summary(self) -> dict:
        """Flat figures for the trace (prefetch attributes of ``image.window``)."""
        st = self.share.stats
        return {"peers_role": st["role"], "peers_seen": st["peers"],
                "peers_banned": len(st["banned"]), "peers_rejected": st["rejected"],
                "peers_seconds": round(st["seconds"], 3)}

    def _maker_ref(self) -> str:
        return f"peers/{self.share.job}/maker/{self.share.attempt}/{self.key}"

    def _torrent(self, wait_s: float):
        """The set's published torrent; waiting for it up to ``wait_s`` (sooner None when
        the node that claimed to make it is gone)."""
        store = self.share.store
        deadline = time.monotonic() + wait_s
        maker = roster.ClaimWatch(store, self._maker_ref())
        while True:
            digest = store.get_ref(torrent_ref(self.key))
            if digest is not None:
                data = store.read(digest)
                verify(digest, data, source=getattr(store, "url", ""))
                return load_torrent(data, self.items)
            if time.monotonic() >= deadline or self._stop.wait(0.1):
                return None
            if maker.gone():
                log.warning("peers: the maker of set %s is gone: origin", self.key[:12])
                return None

    def fetch(self, stop: threading.Event | None = None) -> list[list]:
        """Bring the set from peers and this node's share of the origin; ``stop`` ends it
        early. Returns the refs left for the origin (peers stalled, or no torrent)."""
        self._stop = stop or self._stop
        share, stats = self.share, self.share.stats
        t0 = time.monotonic()
        try:
            ti = self._torrent(0)
            if ti is None:
                # No torrent published: one node per job takes the set from the origin,
                # makes the torrent and seeds (finish); the others wait for it.
                if share.store.set_ref(self._maker_ref(), share.announcement, exclusive=True):
                    stats["role"] = "maker"
                    self.files.mkdir(parents=True, exist_ok=True)
                    self._link_cached()   # offer() brings the rest
                    return list(self.refs.values())
                ti = self._torrent(share.wait_s)
                if ti is None:
                    stats["role"] = "origin"
                    log.info("peers: no torrent for set %s after %.0fs: origin", self.key[:12],
                             share.wait_s)
                    return list(self.refs.values())
            stats["role"] = "peer"
            self.stats.update(self.summary())   # a start's figures may be taken meanwhile
            share.await_members(share.nodes)
            self._attach(ti)
            self._swarm_fetch()
        except Exception as e:  # noqa: BLE001 - peers only cost time, the origin is there
            log.warning("peers: set %s: %s; the rest comes from the origin", self.key[:12], e)
            log.debug("peers: set %s failed here", self.key[:12], exc_info=True)
        finally:
            stats["seconds"] += time.monotonic() - t0
            stats["banned"] = sorted(share.swarm.banned)
            self.stats.update(self.summary())
        left = [r for name, r in self.refs.items() if name not in self.delivered]
        if self.handle is not None and left:
            # the origin brings these (and offer() hands them over): no second copy
            wanted = {self.file_of[file_name(r[0])][0].name for r in left}
            self.handle.prioritize_files([0 if name in wanted else 4
                                          for name in self._names])
        return left

    def _attach(self, ti) -> None:
        """Add the torrent to the swarm, seeding what the node cache holds already (linked
        or, for bundles, copied into the seed copy: no download); note where each item
        lies (v2 torrents align every file to a piece with pad files, which hold no item)."""
        self.files.mkdir(parents=True, exist_ok=True)
        self.ti, fs, plen = ti, ti.layout(), ti.piece_length()
        tfiles = {f.name: f for f in self.tfiles}
        self._names, self.layout, self._piece_items = [], {}, {}
        for i in range(fs.num_files()):
            name = os.path.basename(fs.file_path(i))
            self._names.append(name)
            if fs.file_flags(i) & fs.flag_pad_file:
                continue
            first, n = fs.piece_index_at_file(i), max(1, -(-fs.file_size(i) // plen))
            for m in tfiles[name].members:
                item = file_name(m.digest)
                self.layout[item] = (first, n)
                for k in range(n):
                    self._piece_items.setdefault(first + k, []).append(item)
        placed = self._link_cached()
        self.handle = self.share.swarm.add(ti, str(self.dir))
        self.share.handles.append(self.handle)
        deadline = time.monotonic() + 60   # libtorrent hashes what was placed
        while (self.handle.status().state in (lt.torrent_status.checking_files,
                                              lt.torrent_status.checking_resume_data)
               and time.monotonic() < deadline):
            time.sleep(0.01)
        pieces = _have(self.handle.status(lt.torrent_handle.query_pieces))
        self._have = {p for p, have in enumerate(pieces) if have}
        for name in placed:
            first, n = self.layout[name]
            # a bundle's member came from the cache, verified: here whatever the piece
            if self.file_of[name][0].bundle or all(pieces[first + k] for k in range(n)):
                self.delivered.add(name)
                self.stats["already_local"] += 1
        self._t_called = time.monotonic()
        self._call_again(self.handle.get_peer_info())

    def _link_cached(self) -> list[str]:
        """The node cache's entries of the set into the seed copy: hard links for items
        that are a file of their own (the cache's files hold exactly the torrent's bytes;
        libtorrent checks them), copies at their place for the members of a bundle (each
        checked by its digest; kept to complete the bundle's piece when the rest comes)."""
        placed = []
        if self.cache is None:
            return placed
        self.files.mkdir(parents=True, exist_ok=True)
        for name, ref in self.refs.items():
            tfile, m = self.file_of[name]
            src = self.cache.path(ref[0])
            dest = self.files / tfile.name
            try:
                if tfile.bundle:
                    if src is None:
                        continue
                    data = Path(src).read_bytes()
                    if sha256_digest(data) != ref[0]:
                        continue   # the cache drops it when read; peers or the origin bring it
                    put_member(self.files, tfile, m, data)
                    self._parts.setdefault(tfile.name, {})[name] = data
                elif not dest.exists():
                    if src is None:
                        continue
                    os.link(src, dest)
            except OSError as e:   # another file system: it comes from peers or the origin
                log.debug("peers: cannot place %s in the seed copy: %s", name, e)
                continue
            placed.append(name)
            self._on_disk.add(name)
        return placed

    # -- who fetches what from the origin -----------------------------------------------------
    def _view(self, peers, t_start: float, now: float) -> tuple[list[str], bool]:
        """This node and those it deals the origin's segments among, sorted: the ``peers``
        connected now (handshake done, by address); and while the job's nodes join (the
        join grace; or, for a node connected to nobody whose calls are answered and hung
        up, up to ``stall_s``: those nodes let it in once they have read the roster), every
        announced node not found unreachable since it was called. Nodes started together
        thus deal the set alike from the start, before all their calls are through; one
        that is not connected when the grace ends drops out, and its segments go to the
        others (rendezvous hashing, ``_mine``); a node alone or firewalled takes them all.
        Also whether the node is still calling: connected to nobody while nodes may still
        answer, it asks the origin for nothing yet (one of them may have the whole set)."""
        swarm = self.share.swarm
        half = lt.peer_info.connecting | lt.peer_info.handshake
        ips = {p.ip[0] for p in peers if not p.flags & half}
        announced = [ip for ip, _ in swarm.endpoints()]
        admitting = not ips and any(now - swarm.hung_up.get(ip, -JOIN_GRACE_S) < 1.0
                                    for ip in announced)
        joining = now - t_start <= JOIN_GRACE_S or (admitting
                                                    and now - t_start <= self.share.stall_s)
        pending = {ip for ip in announced
                   if swarm.unreachable.get(ip, 0) < self._t_called} - ips
        calling = joining and not ips and bool(pending)
        if joining:
            ips |= pending
        return sorted((ips - swarm.banned) | {swarm.ip}), calling

    def _mine(self, view: list[str]) -> list[int]:
        """Indexes of the segments this node fetches from the origin, in order: those
        whose hash with this node's is the highest of the ``view`` (rendezvous hashing: two
        nodes whose views differ by one node disagree only on that node's segments; a node
        gone drops out of the view and its segments go to the others). Alone: all of them,
        from a point of its own (nodes that do not know each other yet start apart)."""
        me = _hash(self.share.swarm.ip)
        others = [_hash(ip) for ip in view if ip != self.share.swarm.ip]
        if not others:
            n = len(self.segments)
            return [(me + i) % n for i in range(n)]
        return [i for i, seg in enumerate(self._segment_hashes)
                if all(_mix(me, seg) > _mix(o, seg) for o in others)]

    def _swarm_fetch(self) -> None:
        """Until every item is here, or neither peers nor the origin made progress for
        ``stall_s``. Driven by events (``Swarm.events``): a piece that passed its hash is
        read back through libtorrent (its disk cache may not have written it yet) and its
        item checked by digest before it enters the cache; an origin fetch that is done is
        cached and handed to libtorrent, and the origin's window refilled. libtorrent's
        state (peers, availability, progress) is asked only every ``TICK_S``: each such
        call waits for its network thread, which a node busy with peers keeps busy, and
        walking every piece each time cost more than the pieces themselves."""
        share, h, swarm = self.share, self.handle, self.share.swarm
        events = swarm.events(self.ti)
        self._got, self._asked, self._unread = {}, set(), set()
        inflight: dict[str, Future] = {}
        t_start = last_progress = last_call = time.monotonic()
        next_tick = t_start
        last_done, view, mine = -1, None, []
        while len(self.delivered) < len(self.refs) and not self._stop.is_set():
            try:
                ev = events.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                ev = None
            progressed = origin_done = False
            for _ in range(EVENT_BATCH):   # then a tick, however busy the peers keep it
                if ev is None:
                    break
                if ev[0] == ORIGIN_DONE:
                    fut = inflight.pop(ev[1], None)
                    origin_done = True
                    progressed |= fut is not None and self._from_origin(ev[1], fut)
                else:
                    progressed |= self._on_piece(*ev)
                try:
                    ev = events.get_nowait()
                except queue.Empty:
                    ev = None
            if ev is not None:
                events.put(ev)   # taken, not handled: after the tick
            now = time.monotonic()
            if progressed:
                last_progress = now
            if now < next_tick:
                if origin_done and view is not None:   # refill the window from what is known
                    self._submit_origin(mine, inflight, events, fresh=False)
                continue
            next_tick = now + TICK_S
            peers = h.get_peer_info()
            swarm.check_peers(peers)
            for p in list(self._unread):   # a read that failed: again
                self._read(p)
            # an origin fetch done whose event another transfer of the set took
            for name in [n for n, f in inflight.items() if f.done()]:
                self._from_origin(name, inflight.pop(name))
            # the origin: this node's segments, each chunk no peer has or is sending
            v, calling = self._view(peers, t_start, now)
            if v != view:
                view, mine = v, self._mine(v)
            # alone while the job has more nodes: one that announced after this node read
            # the roster may call any moment (a knock); until the grace ends, one segment
            # at a time, so that little is fetched twice once they are connected
            self._window = (SEGMENT_BYTES if len(v) == 1 and share.nodes > 1
                            and now - t_start <= JOIN_GRACE_S else ORIGIN_WINDOW)
            if not calling:
                self._submit_origin(mine, inflight, events, fresh=True, peers=peers)
            done = h.status(0).total_payload_download
            if done != last_done:   # partial pieces count as progress
                last_done, last_progress = done, now
            if inflight:
                last_progress = now
            elif swarm.banned and not swarm.endpoints():
                log.info("peers: every peer of set %s is banned: origin for the rest",
                         self.key[:12])
                break
            elif now - last_progress > share.stall_s:
                log.info("peers: no progress for %.1fs on set %s: origin for the rest",
                         share.stall_s, self.key[:12])
                break
            if now - last_call > RECALL_S or (len(v) == 1 and now - last_call > REDIAL_S):
                self._call_again(peers)
                last_call = now
        for name, fut in inflight.items():   # already asked: let them land
            try:
                self._from_origin(name, fut)
            except Exception:  # noqa: BLE001 - the caller's origin pass refetches it
                pass

    def _on_piece(self, kind: str, p: int, data: bytes | None) -> bool:
        """A piece event: one that passed its hash is read back, unless its items are here
        already (the origin's, added here); one read back completes its items, maybe (a
        bundle's piece: all its members; a large item's last piece: the item). Returns
        whether an item was delivered."""
        items = self._piece_items.get(p, ())
        if kind == PIECE_DONE:
            self._have.add(p)
            self._read(p)
            return False
        self._asked.discard(p)
        if data is None:
            self._unread.add(p)
            return False
        self._got[p] = data
        took = False
        for name in items:
            first, n = self.layout[name]
            if name in self.delivered or not all(first + k in self._got for k in range(n)):
                continue
            _, m = self.file_of[name]
            raw = self._got[first] if n == 1 else b"".join(self._got[first + k]
                                                         for k in range(n))
            self._take(name, raw[m.offset:m.offset + m.size])
            took = True
        for name in items:   # keep a piece only while an item of it still needs it
            first, n = self.layout[name]
            if all(it in self.delivered for k in range(n)
                   for it in self._piece_items[first + k]):
                for k in range(n):
                    self._got.pop(first + k, None)
        return took

    def _read(self, p: int) -> None:
        self._unread.discard(p)
        if p not in self._asked and any(it not in self.delivered
                                        for it in self._piece_items.get(p, ())):
            self._asked.add(p)
            self.handle.read_piece(p)

    def _call_again(self, peers) -> None:
        """Call the announced nodes not connected (two calls crossing make one connection).
        libtorrent makes the calls asked of a running torrent in its next round, up to a
        second later, but at once when the torrent resumes: a node connected to nobody
        (just joined, or its first calls were refused by nodes that did not know it yet)
        pauses and resumes its torrent after asking, which drops nothing."""
        h = self.handle
        connected = {p.ip[0] for p in peers}
        for ep in self.share.swarm.endpoints():
            if ep[0] not in connected:
                h.connect_peer(ep)
        if not connected:
            h.pause()
            h.resume()

    def _submit_origin(self, mine: list[int], inflight: dict, events, *, fresh: bool,
                       peers=None) -> None:
        """Ask the origin for this node's next chunks, up to ``ORIGIN_WINDOW`` in flight:
        those of its segments that no peer has or is sending. ``fresh``: ask libtorrent
        who has what (a tick), else use what the last tick learned (an origin fetch just
        landed: its room is refilled at once, not a tick later)."""
        if self.reader is None:
            return
        room = self._window - sum(self.refs[n][3] for n in inflight)
        if room <= 0:
            return
        wanted = [name for i in mine for name in self.segments[i]
                  if name not in self.delivered and name not in inflight
                  and self.layout[name][0] not in self._have]
        if not wanted:
            return
        if fresh:
            self._avail = None
            if any(p.flags & lt.peer_info.seed for p in peers):
                return   # a seed has every piece (its pieces are not in the availability)
            avail = self.handle.piece_availability()   # empty once this node seeds
            if len(avail) < self.ti.num_pieces():
                return
            self._avail = avail
            self._busy = {q["piece_index"] for q in self.handle.get_download_queue()}
        if self._avail is None:
            return
        todo = []
        for name in wanted:
            first, _ = self.layout[name]
            if self._avail[first] > 0 or first in self._busy:
                continue   # a peer has it or is sending it
            todo.append(self.refs[name])
            room -= self.refs[name][3]
            if room <= 0:
                break
        if not todo:
            return
        todo.sort(key=lambda c: (c[1], c[2]))   # pack order: the fetcher coalesces
        for ref, fut in zip(todo, self.reader.submit_chunks(todo, Priority.PREFETCH)):
            name = file_name(ref[0])
            inflight[name] = fut
            fut.add_done_callback(lambda _f, name=name: events.put((ORIGIN_DONE, name, None)))

    def _from_origin(self, name: str, fut: Future) -> bool:
        ref = self.refs[name]
        try:
            raw = fut.result()
            data = self.reader.store_chunk(ref, raw)   # verified, cached
        except Exception as e:  # noqa: BLE001 - left for the origin pass after this one
            log.info("peers: origin fetch of %s failed: %s", ref[0][:19], e)
            return False
        if name in self.delivered:
            return False
        self.delivered.add(name)
        self.prefetched.add(ref[0])
        self.stats["fetched_chunks"] += 1
        self.stats["fetched_bytes"] += ref[4]
        self.stats["origin_bytes"] += len(raw)
        self._add_pieces(name, data)
        return True

    def _add_pieces(self, name: str, data: bytes) -> None:
        """An item from the origin to libtorrent, so this node seeds it: a large item's
        pieces at once, a bundle's piece once all its members are here."""
        tfile, _ = self.file_of[name]
        first, _ = self.layout[name]
        if tfile.bundle:
            parts = self._parts.setdefault(tfile.name, {})
            parts[name] = data
            if len(parts) == len(tfile.members):
                del self._parts[tfile.name]
                self.handle.add_piece(first, b"".join(parts[file_name(m.digest)]
                                                      for m in tfile.members), 0)
            return
        plen = self.ti.piece_length()
        for k in range(0, max(len(data), 1), plen):
            self.handle.add_piece(first + k // plen, data[k:k + plen], 0)

    def _take(self, name: str, data: bytes) -> None:
        """A chunk from peers: its digest is the trust root (the node cache checks it)."""
        ref = self.refs[name]
        try:
            if sha256_digest(data) != ref[0]:
                raise ValueError(f"the bytes hash to {sha256_digest(data)}")
            if self.cache is not None:
                self.cache.offer(ref[0], data, verified=True)   # just hashed: once is enough
        except Exception as e:  # noqa: BLE001 - a bad chunk is refetched from the origin
            self.share.stats["rejected"] += 1
            log.warning("peers: chunk %s from peers failed verification (%s): refetched from "
                        "the origin", ref[0], e)
            raise RuntimeError(f"torrent of set {self.key[:12]} serves chunk {ref[0]} "
                               f"that fails its digest") from e
        self.delivered.add(name)
        self.prefetched.add(ref[0])
        self.share.stats["peer_chunks"] += 1
        self.share.stats["peer_bytes"] += len(data)
        self.stats["fetched_chunks"] += 1
        self.stats["fetched_bytes"] += ref[4]
        self.stats["peer_bytes"] += len(data)

    # -- what the origin brought --------------------------------------------------------------
    def offer(self, ref: list, data: bytes) -> None:
        """A verified chunk (uncompressed) from the origin: kept so this node seeds it."""
        name = file_name(ref[0])
        if name not in self.refs or name in self.delivered:
            return
        if self.handle is not None:
            self._add_pieces(name, data)
            return
        tfile, m = self.file_of[name]
        self.files.mkdir(parents=True, exist_ok=True)
        if tfile.bundle:
            put_member(self.files, tfile, m, data)
        else:
            tmp = self.files / f".{tfile.name}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, self.files / tfile.name)
        self._on_disk.add(name)

    def finish(self) -> bool:
        """After the origin fetch of a node without the torrent: make, publish and seed it.
        Needs every chunk of the set here; returns whether this node seeds."""
        if self.handle is not None:
            return True
        if not all(name in self._on_disk for name in self.refs):
            return False
        store = self.share.store
        data = make_torrent(str(self.dir), self.items)
        # Seed first, then publish: a node that finds the torrent calls at once, and a
        # call refused for an unknown torrent is retried only a minute later.
        self._attach(load_torrent(data, self.items))
        digest = sha256_digest(data)
        store.write(digest, data)
        # made alike anywhere, so a plain put (an exclusive claim on a registry waits a
        # settle time, which every node waiting for the torrent would wait too)
        store.set_ref(torrent_ref(self.key), digest)
        return True


def _have(status) -> list[bool]:
    """Which pieces the torrent has (libtorrent leaves the list empty once it seeds)."""
    return [True] * status.num_pieces if status.is_seeding else list(status.pieces)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _mix(a: int, b: int) -> int:
    """A node's weight for a segment (rendezvous hashing), from the two hashes."""
    x = (a ^ b) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 29)


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
