"""Can this process serve staged files through FUSE passthrough? Asked of the kernel
itself: a throw-away mount on a temporary directory, its INIT flags read, and one backing
file registered and dropped (the ioctl needs CAP_SYS_ADMIN). Once per process."""

from __future__ import annotations

import functools
import os
import stat

from bootseer.mount.view import Attr
from bootseer.node import alive

CAP_SYS_ADMIN = 21


def has_cap_sys_admin() -> bool:
    try:
        with open("/proc/self/status") as f:
            caps = next(line for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return os.geteuid() == 0
    return bool(int(caps.split()[1], 16) >> CAP_SYS_ADMIN & 1)


class EmptyView:
    """An empty directory that wants passthrough (so INIT asks for it)."""

    def getattr(self, path):
        if path == "/":
            return Attr(mode=stat.S_IFDIR | 0o755, size=0, nlink=2)
        raise FileNotFoundError(path)

    def readdir(self, path):
        return []

    def readlink(self, path):
        raise FileNotFoundError(path)

    def read(self, path, size, offset):
        return b""

    def backing_path(self, path):
        return None


@functools.cache
def passthrough_unavailable() -> str | None:
    """None when passthrough works here, else why not (one short phrase)."""
    from bootseer.mount.devfuse.server import Server
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not has_cap_sys_admin():
        return "no CAP_SYS_ADMIN (mounting /dev/fuse and its backing files need it)"
    # in a state directory of its own: if we are killed mid-probe, the next command's sweep
    # unmounts and removes it
    try:
        state = alive.StateDir("bsmnt-", sweep=False)
    except OSError as e:
        return f"probe failed: {e}"
    with state:
        mountpoint = os.path.join(state.path, "mnt")
        os.mkdir(mountpoint)
        probe_file = os.path.join(state.path, "file")
        open(probe_file, "wb").close()
        server = Server(EmptyView(), mountpoint, name="bootseer-probe", threads=0)
        try:
            server.start()
        except OSError as e:
            return f"cannot mount /dev/fuse ({e.strerror or e})"
        try:
            if not server.passthrough:
                return (f"the kernel offers FUSE 7.{server.kernel_minor} without passthrough "
                        "(Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH=y has it)")
            try:
                channel = server._connected()
                channel.backing_close(channel.backing_open(probe_file))
            except OSError as e:
                return f"the kernel refused a backing file ({e.strerror or e})"
        finally:
            server.stop()
    return None
