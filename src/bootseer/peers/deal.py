"""Who fetches which part of a set from the origin.

The set is cut into segments: runs of the torrent's files (set order, so a node's origin
reads coalesce; a bundle never split) of about ``SEGMENT_BYTES``. Each segment is the share
of one node of this node's view: the one whose hash with the segment is highest
(rendezvous hashing: two nodes whose views differ by one node disagree only on that node's
segments; a node gone drops out of the view and its segments go to the others).
"""

from __future__ import annotations

import hashlib

import libtorrent as lt

from bootseer.peers.torrent import TorrentFile, file_name

SEGMENT_BYTES = 1 << 20     # the unit of the origin's work dealt to nodes (coalesced reads)
JOIN_GRACE_S = 1.0          # how long an announced node not connected yet keeps its share of
                            # the origin's segments (one learned by its knock calls back
                            # within a second)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _mix(a: int, b: int) -> int:
    """A node's weight for a segment (rendezvous hashing), from the two hashes."""
    x = (a ^ b) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 29)


class Deal:
    """The segments of one set (item names, by segment) and this node's (``ip``) part."""

    def __init__(self, tfiles: list[TorrentFile], ip: str):
        self.ip = ip
        self.segments: list[list[str]] = []
        cur: list[str] = []
        size = 0
        for f in tfiles:
            if cur and size + f.size > SEGMENT_BYTES:
                self.segments.append(cur)
                cur, size = [], 0
            cur.extend(file_name(m.digest) for m in f.members)
            size += f.size
        if cur:
            self.segments.append(cur)
        self._segment_hashes = [_hash(seg[0]) for seg in self.segments]

    def view(self, swarm, peers, t_start: float, t_called: float, now: float,
             stall_s: float) -> tuple[list[str], bool]:
        """This node and those it deals the origin's segments among, sorted: the ``peers``
        connected now (handshake done, by address); and while the job's nodes join (the
        join grace; or, for a node connected to nobody whose calls are answered and hung
        up, up to ``stall_s``: those nodes let it in once they have read the roster), every
        announced node not found unreachable since it was called (``t_called``). Nodes
        started together thus deal the set alike from the start, before all their calls
        are through; one that is not connected when the grace ends drops out, and its
        segments go to the others; a node alone or firewalled takes them all. Also whether
        the node is still calling: connected to nobody while nodes may still answer, it
        asks the origin for nothing yet (one of them may have the whole set)."""
        half = lt.peer_info.connecting | lt.peer_info.handshake
        ips = {p.ip[0] for p in peers if not p.flags & half}
        announced = [ip for ip, _ in swarm.endpoints()]
        admitting = not ips and any(now - swarm.hung_up.get(ip, -JOIN_GRACE_S) < 1.0
                                    for ip in announced)
        joining = now - t_start <= JOIN_GRACE_S or (admitting and now - t_start <= stall_s)
        pending = {ip for ip in announced if swarm.unreachable.get(ip, 0) < t_called} - ips
        calling = joining and not ips and bool(pending)
        if joining:
            ips |= pending
        return sorted((ips - swarm.banned) | {swarm.ip}), calling

    def mine(self, view: list[str]) -> list[int]:
        """Indexes of the segments this node fetches from the origin, in order: those
        whose hash with this node's is the highest of the ``view``. Alone: all of them,
        from a point of its own (nodes that do not know each other yet start apart)."""
        me = _hash(self.ip)
        others = [_hash(ip) for ip in view if ip != self.ip]
        if not others:
            n = len(self.segments)
            return [(me + i) % n for i in range(n)]
        return [i for i, seg in enumerate(self._segment_hashes)
                if all(_mix(me, seg) > _mix(o, seg) for o in others)]
