"""OCI chain IDs: the identity of a stack of layers, as containerd names its committed
layer snapshots (``containerd.io/snapshot.ref``). chain(1) = diff_id(1); chain(n) =
sha256(chain(n-1) + " " + diff_id(n)). They depend only on the uncompressed layers, so a
manifest converted between formats (docker v2s2 <-> OCI) keeps them."""

from __future__ import annotations

import hashlib


def chain_ids(diff_ids: list[str]) -> list[str]:
    chains: list[str] = []
    for d in diff_ids:
        chains.append(d if not chains else
                      "sha256:" + hashlib.sha256(f"{chains[-1]} {d}".encode()).hexdigest())
    return chains


def of_config(config: dict) -> list[str]:
    """The chain IDs of an image config's ``rootfs.diff_ids`` ([] when it has none)."""
    return chain_ids(list((config.get("rootfs") or {}).get("diff_ids") or []))
