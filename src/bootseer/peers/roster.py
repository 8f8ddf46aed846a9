"""Who is in the job: each node announces ``ip:port`` under the store ref
``peers/<job>/nodes/<node>`` (a small JSON blob), and reads the others' the same way: once
when it joins, and again only when a node it does not know yet calls it (``PeerShare``).
Announcements are untrusted like any blob: only a well-formed IPv4 ``ip:port`` is used."""

from __future__ import annotations

import ipaddress
import json
import logging

from bootseer.store.digest import sha256_digest

log = logging.getLogger(__name__)


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
    """``{node: ip:port}`` of every node that announced itself in ``job``."""
    out = {}
    for name in store.list_refs(_prefix(job)):
        try:
            digest = store.get_ref(name)
            entry = json.loads(store.read(digest)) if digest else None
        except Exception as e:  # noqa: BLE001 - a bad announcement is skipped, not fatal
            log.info("peers: skipping announcement %s: %s", name, e)
            continue
        addr = _valid(entry.get("addr")) if isinstance(entry, dict) else None
        if addr:
            out[name[len(_prefix(job)):]] = addr
    return out
