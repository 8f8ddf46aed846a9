"""``bootseer snapshotter serve``: the servicer on a unix socket until SIGINT/SIGTERM.

The socket's directory is made private (containerd runs as root, so does the snapshotter).
A socket file left by a killed snapshotter is replaced only when nothing answers on it:
a second snapshotter on the same address is refused, never silently taking it over.
Stopping leaves the image trees served by their holders (``snapshotter.holder``) for the
next snapshotter, unless ``cleanup_on_close``."""

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
from bootseer.snapshotter.metrics import MetricsServer, parse_addr
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
    """``metrics_addr``: HOST:PORT of the metrics and probes endpoint (None: none);
    ``cleanup_on_close``: stop unmounts every image tree (else their holders serve
    running containers on, for the next snapshotter)."""

    def __init__(self, address: str = DEFAULT_ADDRESS, root: str = DEFAULT_ROOT,
                 workers: int = 16, lazy: LazyImages | None = None,
                 metrics_addr: str | None = None, cleanup_on_close: bool = False):
        self.address = os.path.abspath(address)
        if metrics_addr is not None:
            parse_addr(metrics_addr)   # a bad address refused before anything starts
        _claim_socket(self.address)
        self.cleanup_on_close = cleanup_on_close
        self._serving = threading.Event()
        self.service = SnapshotService(root, lazy)
        self.metrics = (MetricsServer(metrics_addr, self.service, self.ready)
                        if metrics_addr is not None else None)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers,
                                                             thread_name_prefix="snapshots"))
        snapshots_pb2_grpc.add_SnapshotsServicer_to_server(self.service, self.server)
        self.server.add_insecure_port(f"unix://{self.address}")

    def start(self) -> SnapshotterServer:
        self.server.start()
        os.chmod(self.address, 0o600)
        self._serving.set()
        if self.metrics is not None:
            self.metrics.start()
        log.info("serving containerd snapshots on %s (root %s)", self.address,
                 self.service.layout.root)
        return self

    def ready(self) -> bool:
        """Serving: the socket answers and the snapshot records can be read."""
        if not self._serving.is_set():
            return False
        probe = socket.socket(socket.AF_UNIX)
        probe.settimeout(2)
        try:
            probe.connect(self.address)
            with self.service.meta.transaction() as tx:
                tx.ids()
            return True
        except Exception:   # noqa: BLE001 - any failure: not ready
            return False
        finally:
            probe.close()

    def stop(self, grace: float = 5.0) -> None:
        self._serving.clear()
        if self.metrics is not None:
            self.metrics.stop()
        self.server.stop(grace).wait()
        self.service.close(cleanup=self.cleanup_on_close)
        try:
            os.unlink(self.address)
        except FileNotFoundError:
            pass


def serve(address: str, root: str, lazy: LazyImages | None = None, ready=None, *,
          metrics_addr: str | None = None, cleanup_on_close: bool = False) -> int:
    """Serve until SIGINT or SIGTERM; ``ready`` (a callable) runs once the socket listens."""
    done = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda n, f: done.set())
    server = SnapshotterServer(address, root, lazy=lazy, metrics_addr=metrics_addr,
                               cleanup_on_close=cleanup_on_close).start()
    try:
        if ready:
            ready()
        done.wait()
    finally:
        server.stop()
    return 0
