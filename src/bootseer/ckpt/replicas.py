"""Mirrors of a checkpoint: which copies count as the same file.

A checkpoint may be served by several servers (``--mirror URL``): the same relative path
under each mirror is the same file, checked by size and mtime (which nginx's ETag is made
of). The copies are read as one :class:`~bootseer.store.replicas.Replicas` source: the
fetcher sends each stripe to them in turn, hedges a slow one and fails over from a failed
one (the engine's lane policy). A file that changed on a replica is never papered over:
FileChanged is raised.
"""

from __future__ import annotations

from bootseer.errors import StoreError


class ReplicaMismatch(StoreError):
    """A mirror's file is not the same file as the primary's."""


def check_same(primary_url: str, size: int, mtime: float | None, mirror_url: str,
               mirror_size: int, mirror_mtime: float | None) -> None:
    """Raises ReplicaMismatch unless the mirror's file has the primary's size and mtime."""
    if mirror_size != size:
        raise ReplicaMismatch(
            f"mirror {mirror_url} is {mirror_size} bytes but {primary_url} is {size}: "
            "refusing the mirror (a mirror must be an exact copy of the checkpoint)",
            url=mirror_url)
    if mtime and mirror_mtime and abs(mirror_mtime - mtime) >= 1:
        raise ReplicaMismatch(
            f"mirror {mirror_url} was modified at {mirror_mtime:.0f}, {primary_url} at "
            f"{mtime:.0f}: refusing the mirror (copy it with its times, e.g. rsync -a)",
            url=mirror_url)
