"""A containerd proxy snapshotter (``bootseer snapshotter serve``): containerd's
``snapshots.v1`` gRPC API over a unix socket, so the kubelet pulls and starts containers
as usual while bootseer prepares their root filesystems.

    metadata.py   snapshot records (sqlite: one transaction per call, crash-safe)
    overlay.py    directories and mounts of ordinary overlayfs snapshots
    service.py    the gRPC servicer: containerd's semantics and error codes
    server.py     the unix-socket server, its lifecycle and signals
"""

DEFAULT_ADDRESS = "/run/bootseer/snapshotter.sock"
DEFAULT_ROOT = "/var/lib/bootseer/snapshotter"
