"""Where housekeeping reads the node's processes and mounts from.

``deps gc`` and its kind decide what is in use from ``/proc`` (every process's files,
maps, working directory) and the mount table. In a container with its own PID namespace
``/proc`` lists only the pod's processes, so a host process or another pod that uses an
environment looks like nobody: gc would remove it. :func:`node_view` therefore refuses to
run there unless told where the node's ``/proc`` is (``--host-proc``, the host's ``/proc``
mounted into the pod); in the node's PID namespace (the host, a pod with ``hostPID``) it
reads ``/proc`` itself, and the mount table of PID 1 when its own mount namespace is
another (a pod's): the node's mounts, not the pod's.

The node's PID namespace is the kernel's initial one, whose inode number is fixed
(``PROC_PID_INIT_INO``). A node that is itself a container (kind) has another: there,
``--host-proc /proc`` says that this PID namespace is the node's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bootseer.errors import UsageError

INIT_PID_NS = "pid:[4026531836]"
"""``readlink /proc/self/ns/pid`` in the kernel's initial PID namespace."""


@dataclass(frozen=True, slots=True)
class ProcView:
    """The processes under ``root`` (a procfs) and the mount table at ``mountinfo``."""
    root: str = "/proc"
    mountinfo: str = "/proc/self/mountinfo"

    def pids(self) -> list[int]:
        try:
            return [int(n) for n in os.listdir(self.root) if n.isdigit()]
        except OSError:
            return []

    def own_pid(self) -> int:
        """This process's pid as ``root`` numbers it (``<root>/self``)."""
        try:
            return int(os.readlink(os.path.join(self.root, "self")))
        except (OSError, ValueError):
            return os.getpid()

    def path(self, pid: int, name: str) -> str:
        return os.path.join(self.root, str(pid), name)

    def alive(self, pid: int) -> bool:
        return pid > 0 and os.path.exists(os.path.join(self.root, str(pid)))


LOCAL = ProcView()


def in_node_pid_namespace() -> bool:
    try:
        return os.readlink("/proc/self/ns/pid") == INIT_PID_NS
    except OSError:
        return False


def _same_mount_namespace_as_init() -> bool:
    try:
        return os.readlink("/proc/self/ns/mnt") == os.readlink("/proc/1/ns/mnt")
    except OSError:
        return True   # cannot tell: keep our own table


def node_view(host_proc: str | None, what: str = "gc") -> ProcView:
    """Where ``what`` reads the node's processes and mounts. Raises UsageError (one
    line, with the fix) in a PID namespace of its own with no ``host_proc``, and when
    ``host_proc`` is not a procfs."""
    if host_proc is not None:
        root = os.path.abspath(host_proc)
        if not os.path.isfile(os.path.join(root, "1", "mountinfo")):
            raise UsageError(f"--host-proc {host_proc}: no 1/mountinfo there, not a /proc; "
                             f"hint: mount the node's /proc (hostPath /proc) and name it")
        if root == "/proc" and _same_mount_namespace_as_init():
            return LOCAL
        return ProcView(root, os.path.join(root, "1", "mountinfo"))
    if not in_node_pid_namespace():
        raise UsageError(f"{what}: this process has a PID namespace of its own (a container's) "
                         f"and cannot see what the node's processes use; hint: run it on the "
                         f"host or in a pod with hostPID: true, or pass --host-proc /host/proc "
                         f"(the node's /proc mounted there)")
    if _same_mount_namespace_as_init():
        return LOCAL
    return ProcView("/proc", "/proc/1/mountinfo")
