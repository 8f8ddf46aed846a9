"""The contract of a startup pipeline of ``bootseer run``: ``prepare`` runs in its own thread
(the three overlap) and returns where its result lives on the host; ``finalize`` runs once
every pipeline is prepared; ``on_ready`` once the job reports ready; ``close`` undoes
everything (unmounts, stops prefetchers) and never raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bootseer.errors import BootseerError


@dataclass
class Prepared:
    path: str
    """Host path of the result: a root filesystem, an environment prefix, a checkpoint dir."""
    target: str | None = None
    """Where the command sees it inside the container (bind mount); None: not bound."""
    env_var: str | None = None
    """Environment variable that tells the command where it is."""
    attrs: dict = field(default_factory=dict)
    """Counters for the trace (bytes, hits, coverage...)."""
    image_config: dict = field(default_factory=dict)
    """An image's own settings for the command (OCI config: ``env`` list, ``workdir``)."""


class FallbackPossible(BootseerError):
    """The bootseer path failed before the command started; the conventional path may
    still work (e.g. the store is unreachable but the registry is not)."""


# Created in the node's state dir once every pipeline is prepared and settled: releases
# large background transfers (the checkpoint's data files).
PREPARED = "prepared"


class Pipeline:
    kind = "?"
    mode = "bootseer"

    def cancel(self) -> None:
        """Stop ``prepare`` early (called from another thread on SIGTERM/SIGINT)."""

    def prepare(self, timeline) -> Prepared:
        raise NotImplementedError

    def finalize(self, prepared: Prepared) -> Prepared:
        """Called once every pipeline is prepared, just before the command starts: a
        pipeline may hand over something better than what it prepared by then."""
        return prepared

    def settled(self) -> bool:
        """Done with the link for now (a lazy image: its hot blocks are local). Large
        background transfers (the checkpoint) wait for every pipeline to settle."""
        return True

    def on_ready(self) -> None:
        pass

    def fallback(self) -> Pipeline:
        raise BootseerError(f"{self.kind} has no conventional fallback")

    def close(self) -> None:
        pass
