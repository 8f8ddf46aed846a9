"""Hot-block profiles: which chunks a start reads, in what order.

A recorded profile lists ``[digest, first_s, count, path, bytes]`` per chunk; a merged one
adds a sixth column, how many of its ``runs`` read the chunk, so merging merged profiles
counts each run once. ``merge`` combines runs (and nodes): a chunk's support is the share
of runs that read it; chunks
below ``min_support`` are dropped; the rest are ordered by median first access and cut
at ``byte_budget``. A profile names its tree and is refused for any other tree.

A profile may also carry ``block_size`` and ``blocks``: per chunk digest, the indices of
its ``block_size`` blocks the start read, in first-access order (a chunk it omits counts
whole, as in older profiles). Merging unites a chunk's block lists; a chunk that some run
read without a block list (an older profile, or another block size than the first
profile's) becomes whole again.
"""

from __future__ import annotations

import json
import re
import statistics
from typing import TYPE_CHECKING

from bootseer.errors import BootseerError
from bootseer.store.digest import sha256_digest
from bootseer.tree.record import block_bytes

if TYPE_CHECKING:
    from bootseer.tree.hotpack import Written

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class ProfileError(BootseerError, ValueError):
    pass


def ref_for(tree: str) -> str:
    return f"images/profile/{tree.removeprefix('sha256:')}"


def merge(profiles: list[dict], *, min_support: float = 0.0, byte_budget: int | None = None
          ) -> dict:
    if not profiles:
        raise ProfileError("nothing to merge")
    trees = {p.get("tree") for p in profiles}
    if len(trees) != 1:
        raise ProfileError("profiles of different trees cannot be merged: "
                           f"{sorted(map(str, trees))}")
    runs = sum(int(p.get("runs", 1)) for p in profiles)
    seen: dict[str, dict] = {}
    # the first profile's block size (the newest, as publish_recorded merges)
    bsize = next((p.get("block_size") for p in profiles if p.get("blocks") is not None), None)
    blocks: dict[str, dict[int, None] | None] = {}   # None: the chunk is hot whole
    for p in profiles:
        theirs = p.get("blocks") if p.get("block_size") == bsize else None
        for d, first, count, path, size, *read_by in p["chunks"]:
            mine = None if theirs is None else theirs.get(d)
            if mine is None:
                blocks[d] = None
            elif blocks.setdefault(d, {}) is not None:
                blocks[d].update(dict.fromkeys(mine))  # type: ignore[union-attr]
            s = seen.setdefault(d, {"firsts": [], "count": 0, "path": path, "bytes": size,
                                    "support": 0})
            s["firsts"].append(first)
            s["count"] += count
            # runs of this profile that read the chunk (older merged profiles lack the
            # column: all of their runs, as before)
            s["support"] += int(read_by[0]) if read_by else int(p.get("runs", 1))
    rows = []
    for d, s in seen.items():
        support = min(s["support"] / runs, 1.0)
        if support + 1e-9 < min_support:
            continue
        rows.append([d, statistics.median(s["firsts"]), s["count"], s["path"], s["bytes"],
                     s["support"], support])
    rows.sort(key=lambda r: (r[1], -r[6]))
    if byte_budget is not None:
        kept, total = [], 0
        for r in rows:
            if total + r[4] > byte_budget:
                break
            kept.append(r)
            total += r[4]
        rows = kept
    out = {"v": 1, "kind": "bootseer.profile", "tree": trees.pop(), "runs": runs,
           "chunks": [r[:6] for r in rows]}
    if bsize is not None:
        out["block_size"] = bsize
        out["blocks"] = {r[0]: list(b) for r in rows if (b := blocks.get(r[0])) is not None}
    return out


def hot_bytes(profile: dict) -> dict[str, int]:
    """The profile's hot set in bytes: whole chunks (``chunk_bytes``) and at the
    granularity the start read (``block_bytes``: only the read blocks of each chunk)."""
    bsize, blocks = profile.get("block_size"), profile.get("blocks") or {}
    rows = profile["chunks"]
    return {"chunk_bytes": sum(r[4] for r in rows),
            "block_bytes": sum(r[4] if bsize is None else block_bytes(r[4], bsize, blocks.get(r[0]))
                               for r in rows)}


def check(profile: dict, tree: str) -> None:
    if profile.get("kind") != "bootseer.profile":
        raise ProfileError("not a bootseer hot-block profile")
    if profile.get("tree") != tree:
        raise ProfileError(f"profile was recorded for tree {profile.get('tree')}, not {tree}: "
                           f"refusing to prefetch another image's blocks")
    _check_blocks(profile)


def _check_blocks(profile: dict) -> None:
    """The block lists, when present, are well formed (a profile comes from the store)."""
    pack = profile.get("pack")
    if pack is not None and not (isinstance(pack, dict) and isinstance(
            pack.get("digest"), str) and _DIGEST.fullmatch(pack["digest"])):
        raise ProfileError(f"the profile's hot pack {pack!r} names no sha256 digest: "
                           "publish the profile again (`image profile push`)")
    blocks, bsize = profile.get("blocks"), profile.get("block_size")
    if blocks is None:
        return
    if type(bsize) is not int or bsize < 4096 or bsize & (bsize - 1) or not isinstance(
            blocks, dict) or not all(
            isinstance(v, list) and all(type(b) is int and b >= 0 for b in v)
            for v in blocks.values()):
        raise ProfileError("the profile's block lists are malformed (block_size must be a "
                           "power of two >= 4096, blocks a map of digest to block indices): "
                           "record it again with `image mount --record`")


def push(store, profile: dict) -> str:
    """Store the profile as its own blob and point the tree's profile ref at it. Refused
    unless it is a profile, with chunk rows, of a tree this store holds."""
    if not isinstance(profile, dict) or profile.get("kind") != "bootseer.profile":
        raise ProfileError("not a bootseer hot-block profile (record one with `image mount "
                           "--record` or make one with `image profile merge`)")
    tree = profile.get("tree")
    if not isinstance(tree, str) or not isinstance(profile.get("chunks"), list):
        raise ProfileError("the profile names no tree or has no chunk list")
    _check_blocks(profile)
    if not store.exists(tree):
        raise ProfileError(f"tree {tree} of this profile is not in {store.url}: convert the "
                           "image into this store first")
    blob = json.dumps(profile, separators=(",", ":")).encode()
    digest = sha256_digest(blob)
    store.write(digest, blob)
    store.set_ref(ref_for(profile["tree"]), digest)
    return digest


def load(store, digest: str) -> dict:
    from bootseer.store.digest import verify
    blob = store.read(digest)
    verify(digest, blob, source=store.url)
    try:
        return json.loads(blob)
    except ValueError as e:
        raise ProfileError(f"profile {digest} is not JSON: {e}") from e


def latest(store, tree: str) -> dict | None:
    d = store.get_ref(ref_for(tree))
    return None if d is None else load(store, d)


def publish_recorded(config, path: str) -> str | None:
    """Merge a start's recorded profile (``path``) into the tree's published one, write
    its hot pack from this node's chunks (:mod:`bootseer.tree.hotpack`; not when the tree
    has no block table) and push the result; None when nothing was recorded or the store
    is read-only."""
    import logging
    import os

    from bootseer.store import open_store
    if not os.path.exists(path):
        return None
    store = open_store(config.store.url, config)
    if not store.writable:   # a normal case (a mirror, read-only NFS): say it once
        logging.getLogger(__name__).warning(
            "store %s is read-only: the hot-block profile is not published", store.url)
        return None
    with open(path) as f:
        new = json.load(f)
    old = latest(store, new["tree"])
    merged = merge([new] + ([old] if old else []))
    written = _write_pack(config, merged)
    if written is not None:
        merged["pack"] = written.entry
    digest = push(store, merged)
    from bootseer.tree.peers import publish_for_profile
    # later starts' nodes join their peers at once, for the chunks the pack leaves
    publish_for_profile(config, store, merged,
                        packed=written.covered if written is not None else frozenset())
    return digest


def _write_pack(config, merged: dict) -> Written | None:
    """The hot pack of ``merged`` from this node's cache, or None
    (no block table, no hot block at hand, or an error: the profile is published without
    a pack)."""
    import logging

    from bootseer.store.client import StoreClient
    from bootseer.tree import blocks, hotpack
    from bootseer.tree.reader import load_toc
    client = StoreClient.of(config)
    store, cache = client.store(), client.cache
    try:
        with client.lane() as f:
            toc = load_toc(store, merged["tree"], f, cache)
            table = blocks.load(toc, lambda d: cache.get(d) or store.read(d))
        return None if table is None else hotpack.write(store, toc, table, merged, cache)
    except Exception as e:  # noqa: BLE001 - the profile is worth publishing without it
        logging.getLogger(__name__).warning("hot pack of tree %s not written: %s",
                                            merged["tree"][:19], e)
        return None
