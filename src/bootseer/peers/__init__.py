"""Peer-to-peer distribution of hot sets among the nodes of one job (issue 16, docs/peers.md).

libtorrent (BitTorrent v2) moves the bytes among the job's nodes; the store stays the
origin and the trust root: every chunk from a peer is verified by its digest like one from
the store. ``share_for`` gives the process's :class:`PeerShare` when the settings want
peers (``BOOTSEER_PEERS_*``), else None.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from pathlib import Path

__all__ = ["share_for"]

log = logging.getLogger(__name__)
_shares: dict[tuple, object] = {}
_lock = threading.Lock()


def share_for(config, store):
    """This process's :class:`~bootseer.peers.share.PeerShare` for the configured job, or
    None when peers are off: mode ``off``, ``auto`` with fewer than 2 nodes, no job id, a
    store that takes no refs, or no libtorrent (imported only when peers are wanted)."""
    p = config.peers
    if p.mode == "off" or (p.mode == "auto" and p.nodes < 2):
        return None
    job = p.job_id or config.trace.job_id
    if not job:
        log.info("peers: no job id (BOOTSEER_PEERS_JOB_ID or BOOTSEER_TRACE_JOB_ID): origin only")
        return None
    if not getattr(store, "writable", False):
        log.info("peers: the store %s takes no refs: origin only", store.url)
        return None
    node = config.trace.node
    if not node or re.search(r"[{}]", node):
        node = socket.gethostname()
    key = (job, node, store.url)
    with _lock:
        share = _shares.get(key)
        if share is None:
            try:
                from bootseer.peers.share import PeerShare, node_ip
                from bootseer.peers.swarm import Swarm
                swarm = Swarm(node_ip(p.interface, store.url), port_min=p.port_min,
                              port_max=p.port_max, upload_cap=p.upload_cap_bytes)
                share = PeerShare(store, swarm, job, node,
                                  str(Path(config.cache.dir).parent / "peers"),
                                  stall_s=p.stall_s, wait_s=p.wait_s,
                                  attempt=config.trace.attempt, nodes=p.nodes)
            except Exception as e:  # noqa: BLE001 - peers only cost time (ImportError too)
                log.warning("peers: off for this node: %s", e)
                return None
            share.min_set_bytes = 0 if p.mode == "on" else p.min_set_bytes
            _shares[key] = share
    return share
