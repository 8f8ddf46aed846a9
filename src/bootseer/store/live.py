"""Which trees processes on this node are reading from a store right now, so that
``store gc`` never removes what a live mount or prefetch still reads.

A long-lived reader of a tree (a lazy mount's server, ``tree.session``; ``image
prefetch``) holds a liveness mark (``bootseer.node.alive``: a flock, gone with its process)
in ``<cache dir>/live-trees/<tree hex>/``; ``store gc`` on the node keeps every tree with a
held mark (and what it reaches), and removes the marks of processes that died. A store
shared by several nodes sees only this node's readers: the grace period (``--min-age``)
covers the others."""

from __future__ import annotations

import os
from pathlib import Path

from bootseer.node import alive

DIRECTORY = "live-trees"


def hold(cache_dir: str | os.PathLike[str], digest: str) -> alive.Mark | None:
    """A mark saying this process reads tree ``digest`` (None where the cache directory
    cannot take one: reading goes on, unprotected)."""
    try:
        return alive.Mark.new_in(Path(cache_dir) / DIRECTORY / digest.split(":", 1)[-1])
    except OSError:
        return None


def trees_in_use(cache_dir: str | os.PathLike[str]) -> set[str]:
    """The trees some live process on this node reads; dead holders' marks are removed."""
    root = Path(cache_dir) / DIRECTORY
    out: set[str] = set()
    try:
        folders = list(root.iterdir())
    except OSError:
        return out
    for folder in folders:
        try:
            marks = list(folder.iterdir())
        except OSError:
            continue
        for mark in marks:
            if mark.name.startswith("."):   # a mark being made: its maker is alive
                out.add(f"sha256:{folder.name}")
                continue
            state = alive.held(mark)
            if state:
                out.add(f"sha256:{folder.name}")
            elif state is False:
                mark.unlink(missing_ok=True)
        try:
            folder.rmdir()   # empty now: its readers are gone
        except OSError:
            pass
    return out
