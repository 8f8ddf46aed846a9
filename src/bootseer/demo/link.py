"""A private network namespace whose loopback is shaped with ``tc tbf`` (netem is absent
on these kernels): every server and client of the demo runs inside it, so they share
one emulated link. Created and deleted here; clients enter it with
``nsenter --net=/run/netns/NAME`` (``ip netns exec`` remounts /sys and breaks runc)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess

UNITS = {"k": 1e3, "m": 1e6, "g": 1e9}


def rate_bits(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"rate {rate!r}: use e.g. 1gbit or 500mbit")
    return float(m.group(1)) * UNITS.get(m.group(2), 1)


@contextlib.contextmanager
def shaped_namespace(rate: str = "1gbit"):
    name = f"bsdemo{os.getpid()}"
    bits = rate_bits(rate)
    burst = max(int(bits / 8 / 250), 256 * 1024)   # larger than the 64 KiB loopback MTU
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root",
                        "tbf", "rate", rate, "burst", str(burst), "latency", "50ms"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
