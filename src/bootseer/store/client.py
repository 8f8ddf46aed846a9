"""This process's client of the store: its backends, its one fetcher, the node cache.

The fetcher's caps (requests in flight, connections per storage host) and its ordering
(demand before prefetch) only mean something when every read of the process goes through
one queue, so there is one :class:`~bootseer.store.fetch.Fetcher` per process and fetch
configuration (a process has one configuration; tests have several), built here and
nowhere else. Callers take a :class:`~bootseer.store.fetch.Lane` of it: a policy and
counters of their own over the shared queue.

A process made by ``fork`` does not inherit the parent's worker threads, so it starts with
no client and builds its own.
"""

from __future__ import annotations

import os
import threading

from bootseer.config import BootseerConfig, FetchConfig
from bootseer.store.backend import Backend
from bootseer.store.cache import NodeCache
from bootseer.store.fetch import Fetcher, Lane, Policy
from bootseer.store.urls import open_backend

_lock = threading.RLock()   # a client is made under it, and takes the fetcher under it
_pid = os.getpid()
_fetchers: dict[FetchConfig, Fetcher] = {}
_clients: dict[BootseerConfig, StoreClient] = {}


def _forget_if_forked() -> None:
    """Under ``_lock``: drop what a parent process made (its threads are not here)."""
    global _pid
    if os.getpid() != _pid:
        _pid = os.getpid()
        _fetchers.clear()
        _clients.clear()


def process_fetcher(config: FetchConfig | None = None) -> Fetcher:
    """This process's fetcher for ``config`` (default: the default fetch settings)."""
    config = config or FetchConfig()
    with _lock:
        _forget_if_forked()
        f = _fetchers.get(config)
        if f is None:
            f = _fetchers[config] = Fetcher(config)
        return f


class StoreClient:
    """The store as this process reaches it: backends by URL, the fetcher, the node cache.
    Get it with :meth:`of`; it lives as long as the process."""

    def __init__(self, config: BootseerConfig):
        self.config = config
        self.fetcher = process_fetcher(config.fetch)
        self._cache: NodeCache | None = None
        self._stores: dict[str, Backend] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, config: BootseerConfig | None = None) -> StoreClient:
        """The process's client for ``config`` (default: from the environment)."""
        config = config or BootseerConfig.from_env()
        with _lock:
            _forget_if_forked()
            c = _clients.get(config)
            if c is None:
                c = _clients[config] = cls(config)
            return c

    @property
    def cache(self) -> NodeCache:
        """The node cache (made on first use: a command that never caches makes no
        directories)."""
        with self._lock:
            if self._cache is None:
                self._cache = NodeCache(self.config.cache)
            return self._cache

    def store(self, url: str | None = None) -> Backend:
        """The backend at ``url`` (default: the configured store), opened once."""
        url = url or self.config.store.url
        with self._lock:
            b = self._stores.get(url)
            if b is None:
                b = self._stores[url] = open_backend(url, self.config)
            return b

    def lane(self, policy: Policy | None = None) -> Lane:
        """Reads of one caller: the fetcher with ``policy`` (default: the configured one)
        and counters of their own; closing the lane fails only its queued reads."""
        return self.fetcher.lane(policy)
