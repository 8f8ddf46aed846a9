"""The one handle of a mount this process serves, and its one unmount.

Every backend's mount comes back as a :class:`MountHandle`: a FUSE server's (mfusepy,
devfuse), a kernel EROFS mount with no server (the blob is local), or a kernel EROFS mount
on a blob that a FUSE server of its own serves (``below``). ``unmount()`` undoes all of it,
through :func:`bootseer.node.mounts.unmount` (umount2, fusermount3 where this process may
not), whatever the backend."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from bootseer.errors import MountError
from bootseer.mount.kinds import Serving
from bootseer.node import alive, mounts

log = logging.getLogger("bootseer.mount")


class _NoServer:
    """Stands for the server process of a mount that has none (EROFS on a local blob):
    alive while mounted, so callers that watch the server watch the mount."""

    pid = None

    def __init__(self, mountpoint: str):
        self.mountpoint = mountpoint

    def is_alive(self) -> bool:
        return os.path.ismount(self.mountpoint)

    def join(self, timeout: float | None = None) -> None:
        pass

    def kill(self) -> None:
        pass


class MountHandle:
    """``proc``: the mount's server process (None: the kernel serves it alone); ``state``:
    the state directory that has the next command undo the mount if this process dies with
    it (``bootseer.node.alive``); ``below``: the mount this one reads from (an EROFS blob's
    FUSE server), unmounted after it; ``hold``: a descriptor closed once unmounted (the
    local blob's shared lock); ``term``: the server unmounts and ends on SIGTERM (devfuse)
    rather than when its connection ends (libfuse)."""

    def __init__(self, mountpoint: str, serving: Serving, *, proc=None,
                 state: alive.StateDir | None = None, below: MountHandle | None = None,
                 hold: int | None = None, term: bool = False):
        self.mountpoint, self.serving = mountpoint, serving
        self._server = proc
        self.proc: Any = proc or (below.proc if below is not None else _NoServer(mountpoint))
        self.state, self.below, self._hold, self._term = state, below, hold, term
        self.stopped = threading.Event()   # set at unmount: helpers of the mount end
        self.after: list[threading.Thread] = []   # work of the mount's: ended by unmount

    @property
    def backend(self) -> str:
        return self.serving.value

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def unmount(self, timeout: float = 20) -> None:
        """Idempotent. A mount whose files are still open is detached (the kernel keeps
        it for them until the last one closes); a blob server below it then gets a short
        grace and is stopped, so nothing outlives the caller (reads of data not yet in
        the page cache fail with EIO from then on). A server that hangs is killed."""
        self.stopped.set()
        immediate = True
        server = self._server
        if mounts.is_mount_point(self.mountpoint):
            try:
                immediate = mounts.unmount(self.mountpoint)
            except MountError as e:
                if server is None:
                    raise
                log.warning("%s: stopping its server", e)   # which ends the connection
                immediate = False
            if not immediate:
                log.info("%s is busy: detached lazily", self.mountpoint)
        if server is not None:
            if self._term and server.is_alive():
                os.kill(server.pid, signal.SIGTERM)
            server.join(timeout)
            if server.is_alive():
                server.kill()
                server.join(5)
            if mounts.is_mount_point(self.mountpoint):   # its server died meanwhile
                mounts.lazy_unmount(self.mountpoint)
        if self.below is not None:
            self.below.unmount(timeout=timeout if immediate else 2)
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None
        if self.state is not None:
            self.state.close()
            self.state = None
        for helper in self.after:
            helper.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unmount()
