"""Where each node's bytes came from, per pipeline: the origin (the image store, the
checkpoint's storage) or the job's peers (docs/peers.md), from what the pipelines recorded:

- ``image``: the ``image.window`` mark's ``store_bytes`` (all the mount fetched from the
  store in its window: demand reads and the prefetch's origin part; a trace without it:
  ``prefetch_origin_bytes``), ``prefetch_peer_bytes`` and ``prefetch_peers_role``;
- ``deps``: a restore's ``deps.fetch`` ``bytes`` (what its fetcher took from the store)
  and the peers' figures ``origin_bytes``, ``peer_bytes``, ``peers_role``, on
  ``deps.extract`` (a snapshot restore: their origin part is counted in the ``deps.fetch``
  it emits) or on ``deps.fetch`` itself (a kernel restore: the blob's fetch that follows
  the peers adds its ``bytes`` to their ``origin_bytes``);
- ``ckpt``: each ``ckpt.load``'s ``bytes_fetched`` (from storage), ``peer_bytes`` and
  ``peers_role``.

An absent attribute is "not traced" (None), never zero: a trace from before peers has origin
bytes and no peer bytes. Bytes are as stored (compressed where the store compresses).
"""

from __future__ import annotations

PIPELINES = ("image", "deps", "ckpt")
ALL = "all"   # the job total over the pipelines


def _add(total, v):
    # a byte count: a non-negative number (bool is an int to Python, not a count to us)
    if type(v) not in _NUMBER or v < 0:
        return total
    return v if total is None else total + v


_NUMBER = (int, float)


def _join(role: str | None, r) -> str | None:
    """The node's peers role so far with one more (several loads may differ: joined)."""
    if r is None or r == role:
        return role
    return str(r) if role is None else ",".join(sorted({*role.split(","), str(r)}))


def node_sources(n) -> dict[str, list]:
    """A node's (``NodeView``) bytes per pipeline: ``{pipeline: [origin, peers, role]}``,
    None where not traced; pipelines that traced neither are left out. (Runs for every
    node of a report: plain loops, nothing done for a pipeline the node did not trace.)"""
    out: dict[str, list] = {}
    if n.windows:
        origin = peers = role = None
        for a in n.windows:
            if not a:
                continue
            origin = _add(origin, a.get("store_bytes", a.get("prefetch_origin_bytes")))
            peers = _add(peers, a.get("prefetch_peer_bytes"))
            role = _join(role, a.get("prefetch_peers_role"))
        if origin is not None or peers is not None:
            out["image"] = [origin, peers, role]
    if n.deps_fetches:
        fetched = extracted = peers = role = None
        for phase, a in n.deps_fetches:
            if not a:
                continue
            if phase == "deps.fetch":   # a kernel restore's has both: they add up
                fetched = _add(_add(fetched, a.get("bytes")), a.get("origin_bytes"))
            else:   # a snapshot restore's deps.fetch counts this origin part already
                extracted = _add(extracted, a.get("origin_bytes"))
            peers = _add(peers, a.get("peer_bytes"))
            role = _join(role, a.get("peers_role"))
        origin = fetched if fetched is not None else extracted
        if origin is not None or peers is not None:
            out["deps"] = [origin, peers, role]
    if n.ckpt_loads:
        origin = peers = role = None
        for a, _ in n.ckpt_loads:
            if not a:
                continue
            origin = _add(origin, a.get("bytes_fetched"))
            peers = _add(peers, a.get("peer_bytes"))
            role = _join(role, a.get("peers_role"))
        if origin is not None or peers is not None:
            out["ckpt"] = [origin, peers, role]
    return out


def peer_share(origin, peers) -> float | None:
    """The share of the bytes that came from peers (None: peers not traced, or no bytes)."""
    if peers is None or not (origin or 0) + peers:
        return None
    return peers / ((origin or 0) + peers)


def job_sources(per_node: dict[str, dict[str, list]]) -> dict[str, dict]:
    """Job totals from :func:`node_sources` of every node: per pipeline (and ``all``)
    ``origin`` and ``peers`` bytes (None: no node traced them), ``peer_share``, ``nodes``
    (that traced the pipeline's bytes), ``peer_nodes`` (that traced bytes from peers) and
    ``roles`` (nodes per peers role: maker, peer, origin); ``all`` also names the node that
    took the most from the origin (``most_origin``: the maker, or a node the peers missed)."""
    # per pipeline: [origin, peers, nodes, peer_nodes, roles]; one pass over the nodes
    acc: dict[str, list] = {}
    peer_nodes = 0
    most: str | None = None
    most_bytes = -1
    for node, src in per_node.items():
        any_peers = False
        node_origin = 0
        for pipeline, (origin, peers, role) in src.items():
            t = acc.get(pipeline)
            if t is None:
                t = acc[pipeline] = [None, None, 0, 0, {}]
            t[0] = _add(t[0], origin)
            node_origin += origin or 0
            t[2] += 1
            if peers is not None:
                t[1] = _add(t[1], peers)
                t[3] += 1
                any_peers = True
            if role:
                t[4][role] = t[4].get(role, 0) + 1
        peer_nodes += any_peers
        if node_origin > most_bytes or (node_origin == most_bytes and most is not None
                                          and node > most):
            most, most_bytes = node, node_origin
    out: dict[str, dict] = {}
    for pipeline in PIPELINES:
        if pipeline in acc:
            origin, peers, nodes, with_peers, roles = acc[pipeline]
            out[pipeline] = {"origin": origin, "peers": peers,
                             "peer_share": peer_share(origin, peers), "nodes": nodes,
                             "peer_nodes": with_peers, "roles": dict(sorted(roles.items()))}
    if out:
        all_origin = all_peers = None
        for figures in out.values():
            all_origin = _add(all_origin, figures["origin"])
            all_peers = _add(all_peers, figures["peers"])
        out[ALL] = {"origin": all_origin, "peers": all_peers,
                    "peer_share": peer_share(all_origin, all_peers),
                    "nodes": sum(1 for src in per_node.values() if src),
                    "peer_nodes": peer_nodes, "roles": {},
                    "most_origin": {"node": most, "origin": most_bytes}}
    return out


def mib(v) -> str:
    """Bytes as MiB for the report's tables ("-": not traced)."""
    if v is None:
        return "-"
    m = v / 2**20
    return f"{m:.0f}" if m >= 100 else f"{m:.1f}" if m >= 0.1 or not v else f"{m:.3f}"


def share_text(v) -> str:
    return "-" if v is None else f"{v * 100:.0f} %"
