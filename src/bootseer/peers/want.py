"""The one answer to "use peers for this set?", for every technique that moves sets.

Peers cost a torrent, a swarm and a join; they pay when several nodes take the same set and
the set is large enough that the origin's one copy saves more than that. The settings
(``PeersConfig``) say: ``off``; ``on`` (always); ``auto``: a job of at least two nodes and a
set of at least ``min_set_bytes``. Each technique adds only what is its own (an environment
must fit the node cache; a checkpoint needs a store for its manifest).
"""

from __future__ import annotations

from bootseer.config import PeersConfig


def wanted(settings: PeersConfig, set_bytes: int | None = None, *,
           publishing: bool = False) -> bool:
    """Whether a set of ``set_bytes`` goes through the peers. ``set_bytes`` None: any set
    (asked before a set is known: whether to join at all). ``publishing``: where a set's
    torrent is made for later starts, whose job size is not known here (not asked)."""
    if settings.mode == "off":
        return False
    if settings.mode == "on":
        return True
    if not publishing and settings.nodes < 2:
        return False
    return set_bytes is None or set_bytes >= settings.min_set_bytes
