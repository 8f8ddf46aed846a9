"""``bootseer snapshotter serve``: the servicer on a unix socket until SIGINT/SIGTERM.

The socket's directory is made private (containerd runs as root, so does the snapshotter).
A socket file left by a killed snapshotter is replaced only when nothing answers on it:
a second snapshotter on the same address is refused, never silently taking it over."""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import threading
from concurrent import futures

import grpc

from bootseer.errors import UsageError
from bootseer.snapshotter import DEFAULT_ADDRESS, DEFAULT_ROOT
from bootseer.snapshotter.lazy import LazyImages
from bootseer.snapshotter.proto import snapshots_pb2_grpc
from bootseer.snapshotter.service import SnapshotService

log = logging.getLogger(__name__)
_MAX_SOCKET_PATH = 107   # sun_path holds 108 bytes with its NUL


def _claim_socket(address: str) -> None:
    if len(address.encode()) > _MAX_SOCKET_PATH:
        raise UsageError(f"socket path {address!r} is over {_MAX_SOCKET_PATH} bytes; "
                         f"hint: choose a shorter --address")
    os.makedirs(os.path.dirname(address) or ".", mode=0o700, exist_ok=True)
    try:
        st = os.lstat(address)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UsageError(f"{address} exists and is not a socket: refusing to replace it")
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(address)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(address)   # left by a snapshotter that died
        return
    finally:
        probe.close()
    raise UsageError(f"another snapshotter already serves {address}")


class SnapshotterServer:
    def __init__(self, address: str = DEFAULT_ADDRESS, root: str = DEFAULT_ROOT,
                 workers: int = 16, lazy: LazyImages | None = None):
        self.address = os.path.abspath(address)
        _claim_socket(self.address)
        self.service = SnapshotService(root, lazy)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers,
                                                             thread_name_prefix="snapshots"))
        snapshots_pb2_grpc.add_SnapshotsServicer_to_server(self.service, self.server)
        self.server.add_insecure_port(f"unix://{self.address}")

    def start(self) -> SnapshotterServer:
        self.server.start()
        os.chmod(self.address, 0o600)
        log.info("serving containerd snapshots on %s (root %s)", self.address,
                 self.service.layout.root)
        return self

    def stop(self, grace: float = 5.0) -> None:
        self.server.stop(grace).wait()
        self.service.close()
        try:
            os.unlink(self.address)
        except FileNotFoundError:
            pass


def serve(address: str, root: str, lazy: LazyImages | None = None, ready=None) -> int:
    """Serve until SIGINT or SIGTERM; ``ready`` (a callable) runs once the socket listens."""
    done = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda n, f: done.set())
    server = SnapshotterServer(address, root, lazy=lazy).start()
    try:
        if ready:
            ready()
        done.wait()
    finally:
        server.stop()
    return 0
