"""``bootseer csi serve``: the Identity and Node services on a unix socket until
SIGINT/SIGTERM, where the node-driver-registrar and the kubelet find it.

A socket file left by a killed plugin is replaced only when nothing answers on it: a
second plugin on the same endpoint is refused, never silently taking it over."""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import threading
from collections.abc import Callable
from concurrent import futures

import grpc

from bootseer.config import BootseerConfig
from bootseer.csi.proto import csi_pb2_grpc
from bootseer.csi.service import IdentityServicer, NodeServicer
from bootseer.csi.volumes import Settings, Volumes
from bootseer.errors import UsageError

log = logging.getLogger(__name__)
_MAX_SOCKET_PATH = 107   # sun_path holds 108 bytes with its NUL


def socket_path(endpoint: str) -> str:
    """``unix:///csi/csi.sock`` (the form the kubelet's CSI_ENDPOINT takes) or a path."""
    path = endpoint.removeprefix("unix://") if endpoint.startswith("unix://") else endpoint
    if "://" in path or not path:
        raise UsageError(f"endpoint {endpoint!r} is not unix:///PATH; hint: "
                         f"--endpoint unix:///csi/csi.sock")
    path = os.path.abspath(path)
    if len(path.encode()) > _MAX_SOCKET_PATH:
        raise UsageError(f"socket path {path!r} is over {_MAX_SOCKET_PATH} bytes; "
                         f"hint: choose a shorter --endpoint")
    return path


def _claim_socket(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UsageError(f"{path} exists and is not a socket: refusing to replace it")
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)   # left by a plugin that died
        return
    finally:
        probe.close()
    raise UsageError(f"another CSI plugin already serves {path}")


class CsiServer:
    def __init__(self, endpoint: str, config: BootseerConfig, settings: Settings, *,
                 node_id: str, workers: int = 8):
        self.path = socket_path(endpoint)
        _claim_socket(self.path)
        self.ready = threading.Event()
        self.volumes = Volumes(config, settings)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers,
                                                             thread_name_prefix="csi"))
        csi_pb2_grpc.add_IdentityServicer_to_server(IdentityServicer(self.ready), self.server)
        csi_pb2_grpc.add_NodeServicer_to_server(NodeServicer(self.volumes, node_id),
                                                self.server)
        self.server.add_insecure_port(f"unix://{self.path}")

    def start(self) -> CsiServer:
        self.server.start()
        os.chmod(self.path, 0o600)   # the kubelet and the registrar run as root
        self.ready.set()
        log.info("serving CSI (Identity, Node) on %s", self.path)
        return self

    def stop(self, grace: float = 5.0) -> None:
        self.server.stop(grace).wait()
        self.volumes.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def serve(endpoint: str, config: BootseerConfig, settings: Settings, *, node_id: str,
          ready: Callable[[], None] | None = None) -> int:
    """Serve until SIGINT or SIGTERM; ``ready`` runs once the socket listens."""
    done = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda n, f: done.set())
    server = CsiServer(endpoint, config, settings, node_id=node_id).start()
    try:
        if ready:
            ready()
        done.wait()
    finally:
        server.stop()
    return 0
