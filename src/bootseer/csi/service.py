"""The CSI Identity and Node servicers: the spec's semantics and status codes over
``volumes``.

Status codes, as the spec has the kubelet read them: a refused attribute, id or path is
INVALID_ARGUMENT (one line naming it, never retried into success); an environment still
being built, or a store or checkpoint server that cannot be reached, UNAVAILABLE (the
kubelet retries with back-off); an unknown key or checkpoint NOT_FOUND; a target path
holding another volume ALREADY_EXISTS; anything else INTERNAL, with its one line."""

from __future__ import annotations

import logging
import threading

import grpc

from bootseer import __version__, redact
from bootseer.csi import DRIVER_NAME
from bootseer.csi.attributes import VolumeAttributeError, check_volume_id, parse
from bootseer.csi.proto import csi_pb2, csi_pb2_grpc
from bootseer.csi.volumes import (
    EnvironmentBuilding,
    EnvironmentNotFound,
    VolumeConflict,
    Volumes,
)
from bootseer.errors import BlobNotFound, FetchError, UsageError

log = logging.getLogger(__name__)

# the most volumes a node serves at once (each holds a mount; a checkpoint also a server)
MAX_VOLUMES_PER_NODE = 0     # 0: the spec's "the CO decides"

_CODES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], grpc.StatusCode],
              ...] = (
    (VolumeAttributeError, grpc.StatusCode.INVALID_ARGUMENT),
    (UsageError, grpc.StatusCode.INVALID_ARGUMENT),
    (EnvironmentBuilding, grpc.StatusCode.UNAVAILABLE),
    ((EnvironmentNotFound, BlobNotFound), grpc.StatusCode.NOT_FOUND),
    (VolumeConflict, grpc.StatusCode.ALREADY_EXISTS),
    (FetchError, grpc.StatusCode.UNAVAILABLE),
    (ConnectionError, grpc.StatusCode.UNAVAILABLE),
)


def status_of(e: BaseException) -> grpc.StatusCode:
    for kinds, code in _CODES:
        if isinstance(e, kinds):
            return code
    return grpc.StatusCode.INTERNAL


def _one_line(e: BaseException) -> str:
    text = " ".join(redact.text(str(e)).split()) or type(e).__name__
    return text[:1000]


class IdentityServicer(csi_pb2_grpc.IdentityServicer):
    def __init__(self, ready: threading.Event | None = None):
        self.ready = ready

    def GetPluginInfo(self, request, context):
        return csi_pb2.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=__version__)

    def GetPluginCapabilities(self, request, context):
        # a node plugin only: no CONTROLLER_SERVICE, no topology constraints
        return csi_pb2.GetPluginCapabilitiesResponse(capabilities=[])

    def Probe(self, request, context):
        from google.protobuf.wrappers_pb2 import BoolValue
        ready = self.ready is None or self.ready.is_set()
        return csi_pb2.ProbeResponse(ready=BoolValue(value=ready))


class NodeServicer(csi_pb2_grpc.NodeServicer):
    def __init__(self, volumes: Volumes, node_id: str):
        self.volumes, self.node_id = volumes, node_id

    def _fail(self, context, e: BaseException, what: str):
        code = status_of(e)
        message = _one_line(e)
        if code == grpc.StatusCode.INTERNAL:
            log.exception("%s failed", what)
        else:
            log.info("%s: %s: %s", what, code.name, message)
        context.abort(code, message)

    def NodeGetInfo(self, request, context):
        return csi_pb2.NodeGetInfoResponse(node_id=self.node_id,
                                           max_volumes_per_node=MAX_VOLUMES_PER_NODE)

    def NodeGetCapabilities(self, request, context):
        # no STAGE_UNSTAGE_VOLUME: the kubelet publishes straight to the target path
        return csi_pb2.NodeGetCapabilitiesResponse(capabilities=[])

    def NodePublishVolume(self, request, context):
        try:
            cap = request.volume_capability
            if not request.HasField("volume_capability"):
                raise VolumeAttributeError("volume_capability is required")
            if cap.WhichOneof("access_type") != "mount":
                raise VolumeAttributeError("a bootseer volume is a filesystem (mount), not "
                                           "a block device")
            volume = parse(request.volume_id, request.target_path,
                           dict(request.volume_context),
                           kubelet_dir=self.volumes.settings.kubelet_dir,
                           allowed_prefixes=self.volumes.settings.allowed_checkpoint_prefixes)
            self.volumes.publish(volume)
        except Exception as e:  # noqa: BLE001 - every failure is the caller's one status line
            self._fail(context, e, f"NodePublishVolume {request.volume_id[:64]}")
        return csi_pb2.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request, context):
        try:
            check_volume_id(request.volume_id)
            self.volumes.unpublish(request.volume_id, request.target_path)
        except Exception as e:  # noqa: BLE001 - every failure is the caller's one status line
            self._fail(context, e, f"NodeUnpublishVolume {request.volume_id[:64]}")
        return csi_pb2.NodeUnpublishVolumeResponse()
