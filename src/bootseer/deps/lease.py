"""One builder per environment key across all nodes: a TTL lease in the store."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from bootseer.store.digest import sha256_digest

log = logging.getLogger(__name__)
LEASE_TTL_S = 120.0


def lease_ref(key: str) -> str:
    return f"deps/lease/{key.removeprefix('sha256:')}"


def _this_process(pid: int | None = None) -> dict:
    """Who holds a lease, precisely enough for another process to tell, on the same node,
    that the holder is dead: boot, pid namespace, pid and its start time (pids recycle)."""
    pid = pid or os.getpid()
    try:
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
        pidns = os.readlink("/proc/self/ns/pid")
        with open(f"/proc/{pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return {}
    return {"host": socket.gethostname(), "boot": boot, "pidns": pidns, "pid": pid,
            "start": start}


def _died_here(holder: dict | None) -> bool:
    """Whether ``holder`` (a lease's ``process``) is a process of this node, seen from this
    pid namespace, that no longer runs: its lease need not wait out its TTL (a builder
    SIGKILLed would otherwise hold every retry on the node for minutes)."""
    if not isinstance(holder, dict) or not holder.get("pid"):
        return False
    me = _this_process()
    if not me or any(holder.get(k) != me[k] for k in ("host", "boot", "pidns")):
        return False
    now = _this_process(int(holder["pid"]))
    return not now or now["start"] != holder.get("start")


class Lease:
    """A TTL lease on a key in the store: a ref to a small JSON blob (owner, expiry),
    created only if absent; renewed by a thread while building; expired leases are
    taken over."""

    def __init__(self, store, key: str, ttl: float = LEASE_TTL_S):
        self.store, self.key, self.ttl = store, key, ttl
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()

    def _blob(self) -> str:
        data = json.dumps({"owner": self.owner, "expires": time.time() + self.ttl,
                           "process": _this_process()}).encode()
        d = sha256_digest(data)
        self.store.write(d, data)
        return d

    def acquire(self) -> bool:
        if self.store.set_ref(lease_ref(self.key), self._blob(), exclusive=True):
            threading.Thread(target=self._renew, daemon=True).start()
            return True
        current = self.store.get_ref(lease_ref(self.key))
        if current is not None:
            try:
                info = json.loads(self.store.read(current))
            except (OSError, ValueError):
                info = {"expires": 0}
            if _died_here(info.get("process")):
                log.warning("lease on %s held by %s, a process of this node that died: "
                            "taking over", self.key[:19], info.get("owner"))
                self.store.delete_ref(lease_ref(self.key))
                return self.acquire()
            if info.get("expires", 0) < time.time():
                log.warning("lease on %s held by %s expired: taking over", self.key[:19],
                            info.get("owner"))
                self.store.delete_ref(lease_ref(self.key))
                return self.acquire()
        return False

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.store.set_ref(lease_ref(self.key), self._blob())
            except OSError as e:
                log.warning("cannot renew lease: %s", e)

    def release(self) -> None:
        self._stop.set()
        try:
            self.store.delete_ref(lease_ref(self.key))
        except OSError:
            pass
