"""This node's membership in a job's peers: one swarm, the roster, and the sets it moves.

The roster is read when this node joins and again only when an unknown node calls (a
knock: it joined later). Each set moves as a ``transfer.SetTransfer``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from bootseer.config import PeersConfig
from bootseer.peers import roster
from bootseer.peers.seedcopy import remove_unused_sets
from bootseer.peers.source import ChunkSource, SetItem
from bootseer.peers.swarm import Swarm
from bootseer.peers.transfer import SetTransfer
from bootseer.peers.want import wanted

log = logging.getLogger(__name__)

JOIN_WAIT_S = 0.3           # at join, how long to look for the job's other nodes announcing


class PeerShare:
    """Peers for sets on this node. ``group`` names the roster and the makers' claims (the
    job's id, with its namespace: ``share_for``); ``settings`` are the peers settings,
    which say which sets are worth it (``wants``), the stall and wait times and the job's
    size; ``attempt``: a restart of the job has its own makers."""

    def __init__(self, store, swarm: Swarm, group: str, node: str, work_dir: str,
                 settings: PeersConfig, *, attempt: int = 0, refresh_s: float = 0.05):
        self.store, self.swarm, self.group, self.node = store, swarm, group, node
        self.settings, self.attempt = settings, attempt
        self.work_dir = Path(work_dir)
        remove_unused_sets(self.work_dir)
        self.refresh_s = refresh_s
        self.announcement = roster.announce(store, group, node, swarm.addr)
        self.handles: list = []
        self.roster_reads = 0
        self.stats: dict[str, Any] = {"role": None, "peer_chunks": 0, "peer_bytes": 0,
                                      "rejected": 0, "banned": [], "peers": 0,
                                      "seconds": 0.0}
        self._stop = threading.Event()
        self._roster_lock = threading.Lock()
        self.read_roster()
        threading.Thread(target=self._learn, daemon=True, name="bootseer-peers").start()

    def wants(self, set_bytes: int) -> bool:
        """Whether a set of ``set_bytes`` is worth moving through the peers."""
        return wanted(self.settings, set_bytes)

    # -- the roster ---------------------------------------------------------------------------
    def read_roster(self) -> list[tuple[str, int]]:
        """Admit the job's announced nodes; call the new ones from every torrent (they
        called this node and were refused, or will find it seeding). Returns the new."""
        with self._roster_lock:
            found = roster.members(self.store, self.group)
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
    def open_set(self, items: list[SetItem], source: ChunkSource,
                 stats: dict | None = None) -> SetTransfer:
        return SetTransfer(self, items, source, stats)

    def close(self) -> None:
        self._stop.set()
        self.swarm.close()
