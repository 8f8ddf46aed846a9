"""Peer-to-peer distribution of sets among the nodes of one job (docs/peers.md).

libtorrent (BitTorrent v2) moves the bytes among the job's nodes; the store stays the
origin and the trust root: every item from a peer is verified by its digest like one from
the store. Peers move generic sets (``source``: ordered items and a source behind them);
the techniques' adapters (``bootseer.tree.peer_source``, ``bootseer.ckpt.peers``) say what
a set is. ``wanted`` decides whether a set goes through the peers; ``share_for`` gives the
process's :class:`~bootseer.peers.share.PeerShare` of a job's swarm.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from pathlib import Path

from bootseer.peers.want import wanted

__all__ = ["job_of", "share_for", "wanted"]

log = logging.getLogger(__name__)
_shares: dict[tuple, object] = {}
_lock = threading.Lock()


def job_of(config) -> str | None:
    """The job whose nodes share: ``peers.job_id``, else the trace's job id."""
    return config.peers.job_id or config.trace.job_id or None


def share_for(config, store, namespace: str = ""):
    """This process's :class:`~bootseer.peers.share.PeerShare` for the configured job, or
    None when peers are off: mode ``off``, ``auto`` with fewer than 2 nodes, no job id, a
    store that takes no refs, or no libtorrent (imported only when peers are wanted).

    ``namespace`` separates swarms of one job (an environment's, a checkpoint's) from the
    image's, the default: each has its own roster, ``peers/<job>-<namespace>/``, and its
    own share in the process, so their alerts never mix."""
    p = config.peers
    if not wanted(p):
        return None
    job = job_of(config)
    if not job:
        log.info("peers: no job id (BOOTSEER_PEERS_JOB_ID or BOOTSEER_TRACE_JOB_ID): origin only")
        return None
    group = f"{job}-{namespace}" if namespace else job
    if not getattr(store, "writable", False):
        log.info("peers: the store %s takes no refs: origin only", store.url)
        return None
    node = config.trace.node
    if not node or re.search(r"[{}]", node):
        node = socket.gethostname()
    key = (group, node, store.url)
    with _lock:
        share = _shares.get(key)
        if share is None:
            try:
                from bootseer.peers.address import node_ip
                from bootseer.peers.share import PeerShare
                from bootseer.peers.swarm import Swarm
                swarm = Swarm(node_ip(p.interface, store.url), port_min=p.port_min,
                              port_max=p.port_max, upload_cap=p.upload_cap_bytes)
                share = PeerShare(store, swarm, group, node,
                                  str(Path(config.cache.dir).parent / "peers"), p,
                                  attempt=config.trace.attempt)
            except Exception as e:  # noqa: BLE001 - peers only cost time (ImportError too)
                log.warning("peers: off for this node: %s", e)
                return None
            _shares[key] = share
    return share
