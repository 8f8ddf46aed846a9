"""Who is in the job: each node announces ``ip:port`` under the store ref
``peers/<job>/nodes/<node>`` (a small JSON blob), and reads the others' the same way: once
when it joins, and again only when a node it does not know yet calls it (``PeerShare``).
Announcements are untrusted like any blob: only a well-formed IPv4 ``ip:port`` is used."""

from __future__ import annotations

import ipaddress
import json
import logging
from concurrent.futures import ThreadPoolExecutor

from bootseer.store.digest import sha256_digest

log = logging.getLogger(__name__)
READERS = 16   # announcements read at once


def _prefix(job: str) -> str:
    return f"peers/{job}/nodes/"


def announce(store, job: str, node: str, addr: str) -> str:
    """Publish this node's address; returns the announcement's digest."""
    blob = json.dumps({"node": node, "addr": addr}, sort_keys=True).encode()
    digest = sha256_digest(blob)
    store.write(digest, blob)
    store.set_ref(_prefix(job) + node, digest)
    return digest


def _valid(addr: object) -> str | None:
    if not isinstance(addr, str):
        return None
    ip, _, port = addr.rpartition(":")
    try:
        ipaddress.IPv4Address(ip)
        if not 0 < int(port) < 65536:
            return None
    except ValueError:
        return None
    return addr


def members(store, job: str) -> dict[str, str]:
    """``{node: ip:port}`` of every node that announced itself in ``job``. The
    announcements are read in parallel: a job's nodes start together and read the roster
    at once, and one after the other each read was a round trip to a busy store."""
    names = list(store.list_refs(_prefix(job)))
    with ThreadPoolExecutor(max_workers=min(READERS, max(1, len(names)))) as pool:
        addrs = list(pool.map(lambda name: _read_announcement(store, name), names))
    return {name[len(_prefix(job)):]: addr for name, addr in zip(names, addrs, strict=True) if addr}


def _read_announcement(store, name: str) -> str | None:
    try:
        digest = store.get_ref(name)
        entry = json.loads(store.read(digest)) if digest else None
    except Exception as e:  # noqa: BLE001 - a bad announcement is skipped, not fatal
        log.info("peers: skipping announcement %s: %s", name, e)
        return None
    return _valid(entry.get("addr")) if isinstance(entry, dict) else None


CLAIM_CHECK_S = 2.0   # a node waiting on another's claim checks the claimant this often


def claimant_answers(store, ref: str, timeout: float = 1.0) -> bool:
    """Whether the node whose announcement the claim ``ref`` points at still answers on its
    peer port (a claim holds the claimant's announcement). Unknown (no claim, an
    unreadable one) counts as answering: only a refused or timed-out call says it is
    gone."""
    import socket
    try:
        digest = store.get_ref(ref)
        entry = json.loads(store.read(digest)) if digest else None
        addr = _valid(entry.get("addr")) if isinstance(entry, dict) else None
    except Exception:  # noqa: BLE001 - cannot tell: keep waiting, as before
        return True
    if addr is None:
        return True
    ip, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((ip, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


class ClaimWatch:
    """While waiting for what a claimant publishes: ``gone()`` is true once its peer port
    refused twice in a row, checked every ``CLAIM_CHECK_S`` (a node killed mid-fetch must
    not hold the others for the whole wait)."""

    def __init__(self, store, ref: str):
        import time
        self.store, self.ref, self._clock = store, ref, time.monotonic
        self._next, self._refusals = self._clock() + CLAIM_CHECK_S, 0

    def gone(self) -> bool:
        if self._clock() < self._next:
            return False
        self._next = self._clock() + CLAIM_CHECK_S
        self._refusals = 0 if claimant_answers(self.store, self.ref) else self._refusals + 1
        return self._refusals >= 2
