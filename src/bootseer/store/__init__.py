"""Bytes: a content-addressed store, its backends, the node cache and the fetcher.

Every byte that crosses the network is a blob addressed by ``sha256:<hex>``, read by
range through the process's one :class:`~bootseer.store.fetch.Fetcher` (held by its
:class:`~bootseer.store.client.StoreClient`) and verified before use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bootseer.store.backend import Backend
from bootseer.store.digest import Digest, sha256_digest

if TYPE_CHECKING:
    from bootseer.config import BootseerConfig

__all__ = ["Backend", "Digest", "sha256_digest", "open_store"]


def open_store(url: str | None = None, config: BootseerConfig | None = None) -> Backend:
    """Open the store at ``url`` (default: the configured store URL)."""
    from bootseer.store.urls import open_backend
    return open_backend(url, config)
