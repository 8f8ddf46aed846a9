"""The demo's cluster on one machine: a storage host and N nodes, each in its own network
namespace with its own address on one bridge.

Only the storage host's link is shaped (``tc tbf`` on what it sends: the image, packages,
checkpoint and store reads all flow from it), so every node shares one storage link while
node-to-node traffic (rendezvous, collectives) runs at bridge speed, as on a cluster whose
nodes share a storage network.

Everything carries the demo's prefix and the creating process's PID (namespaces
``bsdemo<pid>-*``, scratch ``/var/tmp/bsdemo-<pid>-*``): :func:`remove_leftovers` clears what
a killed earlier demo left, and only that.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bootseer.node.mounts import unmount_under
from bootseer.node.proc import pid_alive
from bootseer.testing.netns import Host, Network
from bootseer.testing.netns import remove_leftovers as remove_leftover_netns

PREFIX = "bsdemo"
SCRATCH_ROOT = Path("/var/tmp")


@dataclass(frozen=True)
class Cluster:
    storage: Host
    nodes: list[Host]


@contextlib.contextmanager
def demo_cluster(nodes: int, rate: str):
    """``rate``: the storage link (tc syntax, e.g. ``1gbit``; ``none``: not shaped)."""
    with Network(PREFIX) as net:
        storage = net.add_host("storage", egress_rate=None if rate == "none" else rate)
        yield Cluster(storage, [net.add_host(f"node{i}") for i in range(nodes)])


def scratch_prefix() -> str:
    return f"{PREFIX}-{os.getpid()}-"


def remove_leftovers() -> list[str]:
    """Remove the namespaces (and processes in them) and scratch tmpfs of earlier demos whose
    process is gone; return what was removed."""
    removed = remove_leftover_netns(PREFIX)
    pattern = re.compile(rf"{PREFIX}-(\d+)-")
    for path in sorted(SCRATCH_ROOT.glob(f"{PREFIX}-*")):
        m = pattern.match(path.name)
        if m and path.is_dir() and not pid_alive(int(m.group(1))):
            unmount_under(str(path))
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed
