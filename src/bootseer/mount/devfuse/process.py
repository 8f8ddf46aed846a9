"""A devfuse server in its own process, through the one mount seam (mount/fuse.py's
``mount``: spawned child, view built after the spawn, dies with its owner, noted for the
next command's sweep). Only the child's entry differs from mfusepy's, and that its server
ends on SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

from bootseer.mount import fuse
from bootseer.mount.devfuse.server import Server
from bootseer.mount.handle import MountHandle
from bootseer.mount.kinds import Serving
from bootseer.mount.view import TreeView
from bootseer.node import proc as procs

log = logging.getLogger("bootseer.mount")


def _serve(view_factory, mountpoint: str, name: str, ready, parent_pid: int) -> None:
    os.setsid()
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: stop.set())
    # SIGTERM when the owner dies: the handler above unmounts, so no mount outlives it
    procs.die_with_parent(parent_pid, signal.SIGTERM)
    view = fuse.build_view_or_exit(view_factory, ready)
    server = Server(view, mountpoint, name=name, threads=fuse.FUSE_MAX_THREADS // 2)
    try:
        server.start()
    except OSError as e:
        ready.send(f"error: {e}"[:4000])
        _close(view)
        os._exit(1)
    try:
        # the owner sees the mount before this word and may die in between (SIGKILLed as
        # soon as it is up): then the send fails, and the mount must still go
        try:
            ready.send("ok")
            ready.close()
        except OSError:
            stop.set()
        log.info("devfuse serving %s at %s (passthrough %s)", name, mountpoint,
                 "on" if server.passthrough else "off")
        while not stop.is_set() and not server.ended.wait(0.2):
            pass
    finally:
        server.stop()
        _close(view)
    os._exit(0)


def _close(view) -> None:
    if hasattr(view, "close"):
        try:
            view.close()
        except Exception as e:  # noqa: BLE001 - an unmount never fails on the view
            log.warning("closing the view failed: %s", e)


def mount(view_factory: Callable[[], TreeView], mountpoint: str, *, read_ahead_kb: int = 1024,
          name: str = "bootseer", timeout: float = 30) -> MountHandle:
    """Like :func:`bootseer.mount.fuse.mount`, served by devfuse (needs CAP_SYS_ADMIN).
    The server unmounts itself on SIGTERM (detaching a mount whose files are still open:
    those then fail with ENOTCONN, passthrough files keep reading their staged copy)."""
    return fuse.mount(view_factory, mountpoint, read_ahead_kb=read_ahead_kb, name=name,
                      timeout=timeout, serve=_serve, serving=Serving.DEVFUSE, term=True)
