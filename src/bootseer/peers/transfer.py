"""The transfer of one set on this node.

The set's torrent is made once, where the set is published (the technique's adapter: the
recording node when it pushes a profile, the builder of an environment snapshot). On a
start every node finds it at once, places the items it holds already into its seed copy,
joins the swarm, and from then on takes each item from whichever source comes first: its
share of the set from the origin (``deal.Deal``), the rest from the peers that fetched
theirs. Nobody waits for anybody's whole fetch; an item some peer already has is not
fetched from the origin; a node that is gone (or never came) has its segments dealt to the
others.

A set with no published torrent falls back to one maker per job: it fetches the set from
the origin, makes and publishes the torrent and seeds (``finish``); the others wait for it.

Trust: the torrent's files hold the items as their digests name them, so every item from a
peer is checked by its sha256 before the source keeps it; libtorrent's v2 piece hashes are
a second check that lets it ban a lying peer early.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

import libtorrent as lt

from bootseer.peers import roster
from bootseer.peers.deal import JOIN_GRACE_S, SEGMENT_BYTES, Deal
from bootseer.peers.pieces import PieceMap
from bootseer.peers.seedcopy import SeedCopy
from bootseer.peers.source import ChunkSource, SetItem
from bootseer.peers.swarm import PIECE_DONE
from bootseer.peers.torrent import file_name, layout, load_torrent, make_torrent, set_key
from bootseer.store.digest import sha256_digest, verify

log = logging.getLogger(__name__)

ORIGIN_WINDOW = 4 << 20     # origin bytes in flight per node: small, so a new view applies fast
RECALL_S = 2.0              # a node not connected to an announced peer calls it again this often
REDIAL_S = 0.25             # ... and this often while it is connected to nobody
TICK_S = 0.1                # how often libtorrent's state is asked for (peers, availability)
EVENT_BATCH = 256           # piece events handled between two looks at the time
ORIGIN_DONE = "origin"      # an event of the set's queue: an origin fetch is done


def torrent_ref(key: str) -> str:
    return f"peers/torrents/{key}"


class SetTransfer:
    """The transfer of ``items`` (in set order, each digest once) through ``share`` (a
    ``share.PeerShare``); ``source`` fetches from the origin and keeps verified items;
    ``stats`` (the caller's figures) are counted as items arrive."""

    def __init__(self, share, items: list[SetItem], source: ChunkSource,
                 stats: dict | None = None):
        self.share, self.source = share, source
        self.items = list(items)
        self.refs = {file_name(i.digest): i for i in self.items}
        self.position = {name: k for k, name in enumerate(self.refs)}
        self.key = set_key(self.items)
        self.tfiles = layout(self.items)   # the torrent's files: large items, bundles
        self.file_of = {file_name(m.digest): (f, m) for f in self.tfiles for m in f.members}
        self.seed = SeedCopy(share.work_dir, self.key, self.file_of)
        self.deal = Deal(self.tfiles, share.swarm.ip)
        self.stats = stats if stats is not None else {}
        for k in ("fetched_chunks", "fetched_bytes", "origin_bytes", "peer_bytes",
                  "already_local"):
            self.stats.setdefault(k, 0)
        self.handle: Any = None   # libtorrent's torrent handle, once attached
        self.ti: Any = None   # its torrent_info
        self.pieces: PieceMap   # set with the handle (attached)
        self._parts: dict[str, dict[str, bytes]] = {}   # bundle -> its members here so far
        self.delivered: set[str] = set()
        self.prefetched: set[str] = set()   # digests this transfer delivered
        self._stop = threading.Event()
        self._have: set[int] = set()   # pieces libtorrent has (passed their hash here)
        self._asked: set[int] = set()   # pieces being read back
        self._unread: set[int] = set()   # pieces whose read back failed: again
        self._avail: Any = None   # who has what, as the last tick saw it
        self._busy: set[int] = set()
        self._t_called = 0.0   # when the announced nodes were called (after attaching)
        self._window = ORIGIN_WINDOW   # origin bytes in flight at most, now

    def summary(self) -> dict:
        """Flat figures for the trace (prefetch attributes of ``image.window``)."""
        st = self.share.stats
        return {"peers_role": st["role"], "peers_seen": st["peers"],
                "peers_banned": len(st["banned"]), "peers_rejected": st["rejected"],
                "peers_seconds": round(st["seconds"], 3)}

    def _maker_ref(self) -> str:
        return f"peers/{self.share.group}/maker/{self.share.attempt}/{self.key}"

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

    def fetch(self, stop: threading.Event | None = None) -> list[SetItem]:
        """Bring the set from peers and this node's share of the origin; ``stop`` ends it
        early. Returns the items left for the origin (peers stalled, or no torrent)."""
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
                    self.seed.place_local(self.refs, self.source)   # offer() brings the rest
                    return list(self.items)
                ti = self._torrent(share.settings.wait_s)
                if ti is None:
                    stats["role"] = "origin"
                    log.info("peers: no torrent for set %s after %.0fs: origin", self.key[:12],
                             share.settings.wait_s)
                    return list(self.items)
            stats["role"] = "peer"
            self.stats.update(self.summary())   # a start's figures may be taken meanwhile
            share.await_members(share.settings.nodes)
            self._attach(ti)
            self._swarm_fetch()
        except Exception as e:   # peers only cost time, the origin is there
            log.warning("peers: set %s: %s; the rest comes from the origin", self.key[:12], e)
            log.debug("peers: set %s failed here", self.key[:12], exc_info=True)
        finally:
            stats["seconds"] += time.monotonic() - t0
            stats["banned"] = sorted(share.swarm.banned)
            self.stats.update(self.summary())
        left = [item for name, item in self.refs.items() if name not in self.delivered]
        if self.handle is not None and left:
            # the origin brings these (and offer() hands them over): no second copy
            wanted = {self.file_of[file_name(i.digest)][0].name for i in left}
            self.handle.prioritize_files([0 if name in wanted else 4
                                          for name in self.pieces.names])
        return left

    def _attach(self, ti) -> None:
        """Add the torrent to the swarm, seeding what this node holds already (placed in
        the seed copy: no download)."""
        self.ti = ti
        self.pieces = PieceMap(ti, self.tfiles, self.file_of)
        placed = self.seed.place_local(self.refs, self.source)
        for name, data in placed.items():
            if data is not None:   # a bundle's member: kept to complete its piece
                self._parts.setdefault(self.file_of[name][0].name, {})[name] = data
        self.handle = self.share.swarm.add(ti, str(self.seed.dir))
        self.share.handles.append(self.handle)
        deadline = time.monotonic() + 60   # libtorrent hashes what was placed
        while (self.handle.status().state in (lt.torrent_status.checking_files,
                                              lt.torrent_status.checking_resume_data)
               and time.monotonic() < deadline):
            time.sleep(0.01)
        pieces = _have(self.handle.status(lt.torrent_handle.query_pieces))
        self._have = {p for p, have in enumerate(pieces) if have}
        for name in placed:
            first, n = self.pieces.span[name]
            # a bundle's member was checked by its digest: here whatever the piece
            if self.file_of[name][0].bundle or all(pieces[first + k] for k in range(n)):
                self.delivered.add(name)
                self.stats["already_local"] += 1
        self._t_called = time.monotonic()
        self._call_again(self.handle.get_peer_info())

    def _swarm_fetch(self) -> None:
        """Until every item is here, or neither peers nor the origin made progress for
        ``stall_s``. Driven by events (``Swarm.events``): a piece that passed its hash is
        read back through libtorrent (its disk cache may not have written it yet) and its
        items checked by digest before the source keeps them; an origin fetch that is done
        is kept and handed to libtorrent, and the origin's window refilled. libtorrent's
        state (peers, availability, progress) is asked only every ``TICK_S``: each such
        call waits for its network thread, which a node busy with peers keeps busy, and
        walking every piece each time cost more than the pieces themselves."""
        share, h, swarm = self.share, self.handle, self.share.swarm
        stall_s = share.settings.stall_s
        events = swarm.events(self.ti)
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
            # the origin: this node's segments, each item no peer has or is sending
            v, calling = self.deal.view(swarm, peers, t_start, self._t_called, now, stall_s)
            if v != view:
                view, mine = v, self.deal.mine(v)
            # alone while the job has more nodes: one that announced after this node read
            # the roster may call any moment (a knock); until the grace ends, one segment
            # at a time, so that little is fetched twice once they are connected
            self._window = (SEGMENT_BYTES if len(v) == 1 and share.settings.nodes > 1
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
            elif now - last_progress > stall_s:
                log.info("peers: no progress for %.1fs on set %s: origin for the rest",
                         stall_s, self.key[:12])
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
        already (the origin's, added here); one read back completes its items, maybe.
        Returns whether an item was delivered."""
        if kind == PIECE_DONE:
            self._have.add(p)
            self._read(p)
            return False
        self._asked.discard(p)
        if data is None:
            self._unread.add(p)
            return False
        took = False
        for name, item_bytes in self.pieces.read_back(p, data, self.delivered):
            self._take(name, item_bytes)
            took = True
        self.pieces.release(p, self.delivered)
        return took

    def _read(self, p: int) -> None:
        self._unread.discard(p)
        if p not in self._asked and any(it not in self.delivered
                                        for it in self.pieces.items_in.get(p, ())):
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
        """Ask the origin for this node's next items, up to ``ORIGIN_WINDOW`` in flight:
        those of its segments that no peer has or is sending. ``fresh``: ask libtorrent
        who has what (a tick), else use what the last tick learned (an origin fetch just
        landed: its room is refilled at once, not a tick later)."""
        room = self._window - sum(self.refs[n].stored for n in inflight)
        if room <= 0:
            return
        span = self.pieces.span
        wanted = [name for i in mine for name in self.deal.segments[i]
                  if name not in self.delivered and name not in inflight
                  and span[name][0] not in self._have]
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
            first, _ = span[name]
            if self._avail[first] > 0 or first in self._busy:
                continue   # a peer has it or is sending it
            todo.append(name)
            room -= self.refs[name].stored
            if room <= 0:
                break
        if not todo:
            return
        todo.sort(key=self.position.__getitem__)   # set order: the origin's reads coalesce
        for name, fut in zip(todo, self.source.submit([self.refs[n] for n in todo]), strict=True):
            inflight[name] = fut

            def done(_f: Future, name: str = name) -> None:
                events.put((ORIGIN_DONE, name, None))
            fut.add_done_callback(done)

    def _from_origin(self, name: str, fut: Future) -> bool:
        item = self.refs[name]
        try:
            raw = fut.result()
            data = self.source.accept_origin(item, raw)   # verified, kept
        except Exception as e:  # noqa: BLE001 - left for the origin pass after this one
            log.info("peers: origin fetch of %s failed: %s", item.digest[:19], e)
            return False
        if name in self.delivered:
            return False
        self.delivered.add(name)
        self.prefetched.add(item.digest)
        self.stats["fetched_chunks"] += 1
        self.stats["fetched_bytes"] += item.size
        self.stats["origin_bytes"] += len(raw)
        self._add_pieces(name, data)
        return True

    def _add_pieces(self, name: str, data: bytes) -> None:
        """An item from the origin to libtorrent, so this node seeds it: a large item's
        pieces at once, a bundle's piece once all its members are here."""
        tfile, _ = self.file_of[name]
        first, _ = self.pieces.span[name]
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
        """An item from peers: its digest is the trust root."""
        item = self.refs[name]
        try:
            if sha256_digest(data) != item.digest:
                raise ValueError(f"the bytes hash to {sha256_digest(data)}")
            self.source.accept_peer(item, data)
        except Exception as e:   # a bad item is refetched from the origin
            self.share.stats["rejected"] += 1
            log.warning("peers: chunk %s from peers failed verification (%s): refetched from "
                        "the origin", item.digest, e)
            raise RuntimeError(f"torrent of set {self.key[:12]} serves chunk {item.digest} "
                               f"that fails its digest") from e
        self.delivered.add(name)
        self.prefetched.add(item.digest)
        self.share.stats["peer_chunks"] += 1
        self.share.stats["peer_bytes"] += len(data)
        self.stats["fetched_chunks"] += 1
        self.stats["fetched_bytes"] += item.size
        self.stats["peer_bytes"] += len(data)

    # -- what the origin brought --------------------------------------------------------------
    def offer(self, digest: str, data: bytes) -> None:
        """A verified item (as the torrent holds it) from the origin: kept so this node
        seeds it."""
        name = file_name(digest)
        if name not in self.refs or name in self.delivered:
            return
        if self.handle is not None:
            self._add_pieces(name, data)
            return
        self.seed.put(name, data)

    def finish(self) -> bool:
        """After the origin fetch of a node without the torrent: make, publish and seed it.
        Needs every item of the set here; returns whether this node seeds."""
        if self.handle is not None:
            return True
        if not all(name in self.seed.on_disk for name in self.refs):
            return False
        store = self.share.store
        data = make_torrent(str(self.seed.dir), self.items)
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
