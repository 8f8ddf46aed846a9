"""Separate hosts on one machine: a network namespace per host, each with its own address on
a bridge, the way nodes of a cluster share a network.

The bridge lives in a namespace of its own (the "switch"), so nothing is added to the
machine's own network: every veth pair is created directly between the switch and a host
namespace, and deleting the namespaces deletes every interface. A host can be shaped
(``tc tbf`` on its interface's egress: what it sends), which is how a storage host's link
is capped while node-to-node traffic stays at bridge speed.

Every namespace name starts with ``<prefix><pid>-``: :func:`remove_leftovers` deletes those
of a process that no longer exists (a run killed with SIGKILL), and the processes still
inside them, and nothing else.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.node.proc import pid_alive

NETNS_DIR = Path("/run/netns")
UNITS = {"k": 1e3, "m": 1e6, "g": 1e9}


class NetnsError(BootseerError, RuntimeError):
    pass


def rate_bits(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"rate {rate!r}: use e.g. 1gbit or 500mbit")
    return float(m.group(1)) * UNITS.get(m.group(2), 1)


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    addr: str

    def enter(self) -> list[str]:
        """Argv prefix that runs a command on this host. ``nsenter``, not ``ip netns exec``:
        the latter remounts /sys, which breaks runc."""
        return ["nsenter", f"--net={NETNS_DIR / self.netns}"]


class Network:
    """A bridge and the hosts on it; a context manager that removes all it made."""

    def __init__(self, prefix: str, subnet: str = "10.99.0") -> None:
        self.tag = f"{prefix}{os.getpid()}-"
        self.subnet = subnet
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []
        try:
            self.switch = self._netns("switch")
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def _netns(self, name: str) -> str:
        netns = self.tag + name
        _ip("netns", "add", netns)
        self._made.append(netns)
        _ip("-n", netns, "link", "set", "lo", "up")
        return netns

    def add_host(self, name: str, *, egress_rate: str | None = None) -> Host:
        """A new host ``name`` with the next address; ``egress_rate`` (tc syntax, e.g.
        ``1gbit``) caps what it sends."""
        if len(self.hosts) >= 200:
            raise NetnsError("at most 200 hosts on one bridge")
        netns = self._netns(name)
        addr = f"{self.subnet}.{len(self.hosts) + 2}"
        port = f"p{len(self.hosts)}"   # the switch's end; interface names are <= 15 chars
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
            "netns", netns)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", netns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        if egress_rate:
            # Larger than a GSO segment (64 KiB), or tbf drops every big packet.
            burst = max(int(rate_bits(egress_rate) / 8 / 250), 256 * 1024)
            proc = subprocess.run(["tc", "-n", netns, "qdisc", "add", "dev", "eth0", "root",
                                   "tbf", "rate", egress_rate, "burst", str(burst),
                                   "latency", "50ms"], capture_output=True, text=True)
            if proc.returncode != 0:
                raise NetnsError(f"tc tbf on {name}: {proc.stderr.strip()}")
        host = Host(name, netns, addr)
        self.hosts[name] = host
        return host

    def close(self) -> None:
        for netns in reversed(self._made):
            kill_processes_in(netns)
            subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
        self._made.clear()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _netns_inode(netns: str) -> int | None:
    try:
        return os.stat(NETNS_DIR / netns).st_ino
    except OSError:
        return None


def processes_in(netns: str) -> list[int]:
    """PIDs of the processes whose network namespace is ``netns``."""
    ino = _netns_inode(netns)
    if ino is None:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns" / "net").st_ino == ino:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def kill_processes_in(netns: str, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, each process still in ``netns`` (by PID)."""
    pids = processes_in(netns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            pids = processes_in(netns)
            if not pids:
                return
            time.sleep(0.1)


def remove_leftovers(prefix: str) -> list[str]:
    """Delete the namespaces named ``<prefix><pid>-*`` whose creating process is gone (and
    the processes left in them); return their names."""
    if not NETNS_DIR.is_dir():
        return []
    removed = []
    pattern = re.compile(rf"{re.escape(prefix)}(\d+)-")
    for entry in sorted(NETNS_DIR.iterdir()):
        m = pattern.match(entry.name)
        if m and not pid_alive(int(m.group(1))):
            kill_processes_in(entry.name)
            subprocess.run(["ip", "netns", "delete", entry.name], capture_output=True)
            removed.append(entry.name)
    return removed
