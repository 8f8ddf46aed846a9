"""A CSI node plugin (``bootseer csi serve``): the Container Storage Interface's Identity
and Node services on a unix socket, so an unprivileged pod gets a published environment or
a checkpoint as an inline ephemeral volume (``csi: {driver: csi.bootseer.dev,
volumeAttributes: {environment: sha256:...}}``), with no hostPath and no privilege.

    attributes.py the volume attributes a pod may write, checked (the pod author is not
                  trusted: no path leaves the kubelet's pods directory, no local file URL)
    volumes.py    publish and unpublish: an environment restored as EROFS (bootseer.deps),
                  a checkpoint served striped (bootseer.ckpt); their records on disk
    service.py    the gRPC servicers: the spec's semantics and status codes
    server.py     the unix-socket server, its lifecycle and signals
    proto/        stubs of the spec's csi.proto (the Identity and Node services)
"""

DRIVER_NAME = "csi.bootseer.dev"
DEFAULT_ENDPOINT = "unix:///csi/csi.sock"
DEFAULT_STATE_DIR = "/var/lib/bootseer/csi"
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
