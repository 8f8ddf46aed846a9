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


def _num(v) -> int | float | None:
    # bool is an int to Python, not a byte count to us
    return v if type(v) in (int, float) and v >= 0 else None


def _add(total, v):
    v = _num(v)
    if v is None:
        return total
    return v if total is None else total + v


def _role(roles: set) -> str | None:
    roles.discard(None)
    return ",".join(sorted(map(str, roles))) or None


def node_sources(n) -> dict[str, list]:
    """A node's (``NodeView``) bytes per pipeline: ``{pipeline: [origin, peers, role]}``,
    None where not traced; pipelines that traced neither are left out."""
    out: dict[str, list] = {}
    origin = peers = None
    roles: set = set()
    for a in n.windows:
        origin = _add(origin, a.get("store_bytes", a.get("prefetch_origin_bytes")))
        peers = _add(peers, a.get("prefetch_peer_bytes"))
        roles.add(a.get("prefetch_peers_role"))
    if origin is not None or peers is not None:
        out["image"] = [origin, peers, _role(roles)]
    fetched = extracted = peers = None
    roles = set()
    for phase, a in n.deps_fetches:
        if phase == "deps.fetch":
            fetched = _add(_add(fetched, a.get("bytes")), a.get("origin_bytes"))
        else:
            extracted = _add(extracted, a.get("origin_bytes"))
        peers = _add(peers, a.get("peer_bytes"))
        roles.add(a.get("peers_role"))
    origin = fetched if fetched is not None else extracted
    if origin is not None or peers is not None:
        out["deps"] = [origin, peers, _role(roles)]
    origin = peers = None
    roles = set()
    for a, _ in n.ckpt_loads:
        origin = _add(origin, a.get("bytes_fetched"))
        peers = _add(peers, a.get("peer_bytes"))
        roles.add(a.get("peers_role"))
    if origin is not None or peers is not None:
        out["ckpt"] = [origin, peers, _role(roles)]
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
    ``roles`` (nodes per peers role: maker, peer, origin)."""
    out: dict[str, dict] = {}
    for pipeline in PIPELINES:
        origin = peers = None
        nodes = peer_nodes = 0
        roles: dict[str, int] = {}
        for src in per_node.values():
            row = src.get(pipeline)
            if row is None:
                continue
            nodes += 1
            origin = _add(origin, row[0])
            if row[1] is not None:
                peers = _add(peers, row[1])
                peer_nodes += 1
            if row[2]:
                roles[row[2]] = roles.get(row[2], 0) + 1
        if nodes:
            out[pipeline] = {"origin": origin, "peers": peers,
                             "peer_share": peer_share(origin, peers), "nodes": nodes,
                             "peer_nodes": peer_nodes, "roles": dict(sorted(roles.items()))}
    if out:
        origin = peers = None
        for t in out.values():
            origin, peers = _add(origin, t["origin"]), _add(peers, t["peers"])
        out[ALL] = {"origin": origin, "peers": peers, "peer_share": peer_share(origin, peers),
                    "nodes": sum(1 for src in per_node.values() if src),
                    "peer_nodes": sum(1 for src in per_node.values()
                                      if any(r[1] is not None for r in src.values())),
                    "roles": {}}
    return out


def mib(v) -> str:
    """Bytes as MiB for the report's tables ("-": not traced)."""
    if v is None:
        return "-"
    m = v / 2**20
    return f"{m:.0f}" if m >= 100 else f"{m:.1f}" if m >= 0.1 or not v else f"{m:.3f}"


def share_text(v) -> str:
    return "-" if v is None else f"{v * 100:.0f} %"
