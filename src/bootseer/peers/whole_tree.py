"""A whole tree through the job's peers: the packs of an environment snapshot, before
``deps ensure`` extracts it. Every chunk of the tree not yet on this node comes from the
job's peers (the origin for what they do not deliver) into the node cache, verified like a
chunk from the store; the extract then finds them local. The node seeds the set for as
long as the process lives (``bootseer run``: while the job runs).

Environments have their own roster (``<job>-env``), so their swarm never shares alerts
with an image's hot set in the same process.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

ROSTER_SUFFIX = "-env"
FIGURES = ("origin_bytes", "peer_bytes", "peers_role", "peers_seen", "peers_banned")


def wanted(config, stored_bytes: int, cache_bytes: int) -> bool:
    """Whether peers apply to a tree (before any swarm is made): the settings want them,
    the bytes that would cross the network (``stored_bytes``, compressed) are worth a
    torrent, and the tree fits the node cache (``cache_bytes``, as the cache holds it:
    the chunks wait there for the extract; one evicted would be fetched twice)."""
    p = config.peers
    if p.mode == "off" or (p.mode == "auto" and (p.nodes < 2 or stored_bytes < p.min_set_bytes)):
        return False
    budget = config.cache.budget_bytes
    if budget and cache_bytes > budget // 2:
        log.info("peers: the environment (%d bytes) is over half the node cache budget: "
                 "origin only", cache_bytes)
        return False
    return True


def fetch_tree(config, store, reader) -> dict | None:
    """Bring every chunk of ``reader``'s tree to the node cache through the job's peers;
    returns figures for the trace (``origin_bytes``, ``peer_bytes``, ``peers_role``,
    ``peers_seen``, ``peers_banned``), or None when peers do not apply (then nothing was
    fetched)."""
    from bootseer.peers import share_for
    from bootseer.tree.prefetch import Prefetcher
    chunks = reader.all_chunks()
    if not wanted(config, sum(c[3] for c in chunks), sum(c[4] for c in chunks)):
        return None
    job = config.peers.job_id or config.trace.job_id
    if not job:
        return None
    share = share_for(config.replace(peers={"job_id": job + ROSTER_SUFFIX}), store)
    if share is None:
        return None
    # Every chunk, in pack order (a profile naming them all makes the plan eager).
    pre = Prefetcher(reader, {"chunks": [[c[0]] for c in chunks]}, peers=share)
    pre.start().wait()
    return {k: v for k, v in pre.stats.items() if k in FIGURES}
