"""Hostile inputs built on the fly: a tree whose TOC a store writer forged (paths that
leave the tree, entries under an in-tree symlink, set-id bits), bypassing the builder."""

from __future__ import annotations

import json

import zstandard

from bootseer.store.digest import sha256_digest
from bootseer.tree.build import TreeBuilder


def raw_toc(store, digest: str) -> dict:
    """A stored TOC decoded without any check (what an attacker starts from)."""
    return json.loads(zstandard.ZstdDecompressor().decompress(store.read(digest),
                                                              max_output_size=1 << 30))


def put_toc(store, toc: dict) -> str:
    """Store a TOC document as the builder would encode it, unchecked."""
    blob = zstandard.ZstdCompressor(level=9).compress(
        json.dumps(toc, separators=(",", ":"), sort_keys=True).encode())
    digest = sha256_digest(blob)
    store.write(digest, blob)
    return digest


def entry(path: str, kind: str = "f", **kw) -> dict:
    base = {"path": path, "type": kind, "mode": 0o755 if kind == "d" else 0o644, "uid": 0,
            "gid": 0, "mtime": 0.0, "size": 0}
    if kind == "f":
        base["chunks"] = []
    return {**base, **kw}


def forged_tree(store, extra: list[dict], payload: bytes = b"owned\n") -> str:
    """A valid tree (``/ok`` holds ``payload``) plus the forged ``extra`` entries; forged
    files reuse ``/ok``'s chunks, so every byte they would write is in the store."""
    b = TreeBuilder(store, chunk_size=64 << 10)
    b.add_file("/ok", payload)
    toc = raw_toc(store, b.finish())
    chunks = next(e for e in toc["entries"] if e["path"] == "/ok")["chunks"]
    for e in extra:
        if e["type"] == "f" and not e.get("chunks"):
            e["chunks"], e["size"] = chunks, len(payload)
    toc["entries"] = toc["entries"] + extra   # the attacker's order, not sorted
    return put_toc(store, toc)
