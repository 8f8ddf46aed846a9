"""The CSI stubs speak the spec's wire format: package csi.v1, the services and methods
the kubelet and the node-driver-registrar call, and every message's field names and
numbers as the CSI specification's csi.proto (v1.x, github.com/container-storage-interface/
spec) has them. The table below is copied from the spec, not from our .proto."""

from __future__ import annotations

from pathlib import Path

import pytest

csi_pb2 = pytest.importorskip("bootseer.csi.proto.csi_pb2")

# message -> {field: (number, type name or scalar kind, repeated)}; from spec csi.proto
SPEC_FIELDS: dict[str, dict[str, tuple[int, str, bool]]] = {
    "GetPluginInfoRequest": {},
    "GetPluginInfoResponse": {"name": (1, "string", False),
                              "vendor_version": (2, "string", False),
                              "manifest": (3, "csi.v1.GetPluginInfoResponse.ManifestEntry",
                                           True)},
    "GetPluginCapabilitiesRequest": {},
    "GetPluginCapabilitiesResponse": {"capabilities": (1, "csi.v1.PluginCapability", True)},
    "PluginCapability": {"service": (1, "csi.v1.PluginCapability.Service", False),
                         "volume_expansion": (2, "csi.v1.PluginCapability.VolumeExpansion",
                                              False)},
    "PluginCapability.Service": {"type": (1, "csi.v1.PluginCapability.Service.Type", False)},
    "PluginCapability.VolumeExpansion": {
        "type": (1, "csi.v1.PluginCapability.VolumeExpansion.Type", False)},
    "ProbeRequest": {},
    "ProbeResponse": {"ready": (1, "google.protobuf.BoolValue", False)},
    "VolumeCapability": {"block": (1, "csi.v1.VolumeCapability.BlockVolume", False),
                         "mount": (2, "csi.v1.VolumeCapability.MountVolume", False),
                         "access_mode": (3, "csi.v1.VolumeCapability.AccessMode", False)},
    "VolumeCapability.BlockVolume": {},
    "VolumeCapability.MountVolume": {"fs_type": (1, "string", False),
                                     "mount_flags": (2, "string", True),
                                     "volume_mount_group": (3, "string", False)},
    "VolumeCapability.AccessMode": {
        "mode": (1, "csi.v1.VolumeCapability.AccessMode.Mode", False)},
    "Topology": {"segments": (1, "csi.v1.Topology.SegmentsEntry", True)},
    "NodePublishVolumeRequest": {
        "volume_id": (1, "string", False),
        "publish_context": (2, "csi.v1.NodePublishVolumeRequest.PublishContextEntry", True),
        "staging_target_path": (3, "string", False),
        "target_path": (4, "string", False),
        "volume_capability": (5, "csi.v1.VolumeCapability", False),
        "readonly": (6, "bool", False),
        "secrets": (7, "csi.v1.NodePublishVolumeRequest.SecretsEntry", True),
        "volume_context": (8, "csi.v1.NodePublishVolumeRequest.VolumeContextEntry", True)},
    "NodePublishVolumeResponse": {},
    "NodeUnpublishVolumeRequest": {"volume_id": (1, "string", False),
                                   "target_path": (2, "string", False)},
    "NodeUnpublishVolumeResponse": {},
    "NodeGetCapabilitiesRequest": {},
    "NodeGetCapabilitiesResponse": {"capabilities": (1, "csi.v1.NodeServiceCapability", True)},
    "NodeServiceCapability": {"rpc": (1, "csi.v1.NodeServiceCapability.RPC", False)},
    "NodeServiceCapability.RPC": {"type": (1, "csi.v1.NodeServiceCapability.RPC.Type", False)},
    "NodeGetInfoRequest": {},
    "NodeGetInfoResponse": {"node_id": (1, "string", False),
                            "max_volumes_per_node": (2, "int64", False),
                            "accessible_topology": (3, "csi.v1.Topology", False)},
}
SPEC_ONEOFS = {"PluginCapability": {"type": {"service", "volume_expansion"}},
               "VolumeCapability": {"access_type": {"block", "mount"}},
               "NodeServiceCapability": {"type": {"rpc"}}}
SPEC_ENUMS = {
    "PluginCapability.Service.Type": {
        "UNKNOWN": 0, "CONTROLLER_SERVICE": 1, "VOLUME_ACCESSIBILITY_CONSTRAINTS": 2,
        "GROUP_CONTROLLER_SERVICE": 3, "SNAPSHOT_METADATA_SERVICE": 4},
    "PluginCapability.VolumeExpansion.Type": {"UNKNOWN": 0, "ONLINE": 1, "OFFLINE": 2},
    "VolumeCapability.AccessMode.Mode": {
        "UNKNOWN": 0, "SINGLE_NODE_WRITER": 1, "SINGLE_NODE_READER_ONLY": 2,
        "MULTI_NODE_READER_ONLY": 3, "MULTI_NODE_SINGLE_WRITER": 4,
        "MULTI_NODE_MULTI_WRITER": 5, "SINGLE_NODE_SINGLE_WRITER": 6,
        "SINGLE_NODE_MULTI_WRITER": 7},
    "NodeServiceCapability.RPC.Type": {
        "UNKNOWN": 0, "STAGE_UNSTAGE_VOLUME": 1, "GET_VOLUME_STATS": 2, "EXPAND_VOLUME": 3,
        "VOLUME_CONDITION": 4, "SINGLE_NODE_MULTI_WRITER": 5, "VOLUME_MOUNT_GROUP": 6},
}
SPEC_METHODS = {
    "Identity": {"GetPluginInfo": ("GetPluginInfoRequest", "GetPluginInfoResponse"),
                 "GetPluginCapabilities": ("GetPluginCapabilitiesRequest",
                                           "GetPluginCapabilitiesResponse"),
                 "Probe": ("ProbeRequest", "ProbeResponse")},
    "Node": {"NodePublishVolume": ("NodePublishVolumeRequest", "NodePublishVolumeResponse"),
             "NodeUnpublishVolume": ("NodeUnpublishVolumeRequest",
                                     "NodeUnpublishVolumeResponse"),
             "NodeGetCapabilities": ("NodeGetCapabilitiesRequest",
                                     "NodeGetCapabilitiesResponse"),
             "NodeGetInfo": ("NodeGetInfoRequest", "NodeGetInfoResponse")},
}
_SCALARS = {9: "string", 8: "bool", 3: "int64"}


def _message(name: str):
    d = csi_pb2.DESCRIPTOR.message_types_by_name[name.split(".")[0]]
    for part in name.split(".")[1:]:
        d = d.nested_types_by_name[part]
    return d


def _fields(desc) -> dict[str, tuple[int, str, bool]]:
    out = {}
    for f in desc.fields:
        kind = f.message_type.full_name if f.message_type else \
            f.enum_type.full_name if f.enum_type else _SCALARS[f.type]
        out[f.name] = (f.number, kind, f.is_repeated)
    return out


def test_package_is_the_specs():
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"


@pytest.mark.parametrize("name", sorted(SPEC_FIELDS))
def test_message_fields_match_the_spec(name):
    assert _fields(_message(name)) == SPEC_FIELDS[name]


def test_every_message_of_the_subset_is_in_the_table():
    """A message added to csi.proto must be added to the table (checked against the spec)."""
    seen = set()

    def walk(descs, prefix=""):
        for d in descs:
            if d.GetOptions().map_entry:
                continue
            seen.add(prefix + d.name)
            walk(d.nested_types, prefix + d.name + ".")
    walk(csi_pb2.DESCRIPTOR.message_types_by_name.values())
    assert seen == set(SPEC_FIELDS)


@pytest.mark.parametrize("name", sorted(SPEC_ONEOFS))
def test_oneofs_match_the_spec(name):
    got = {o.name: {f.name for f in o.fields} for o in _message(name).oneofs}
    assert got == SPEC_ONEOFS[name]


@pytest.mark.parametrize("name", sorted(SPEC_ENUMS))
def test_enum_values_match_the_spec(name):
    *outer, enum = name.split(".")
    values = _message(".".join(outer)).enum_types_by_name[enum].values_by_name
    assert {k: v.number for k, v in values.items()} == SPEC_ENUMS[name]


@pytest.mark.parametrize("service", sorted(SPEC_METHODS))
def test_services_and_methods_match_the_spec(service):
    s = csi_pb2.DESCRIPTOR.services_by_name[service]
    assert s.full_name == f"csi.v1.{service}"
    got = {m.name: (m.input_type.name, m.output_type.name) for m in s.methods}
    assert got == SPEC_METHODS[service]
    assert all(not m.client_streaming and not m.server_streaming for m in s.methods)


def test_a_wrong_number_is_caught():
    """The check itself can fail: a field renumbered in a copy of the table is seen."""
    wrong = dict(SPEC_FIELDS["NodePublishVolumeRequest"], target_path=(3, "string", False))
    assert _fields(_message("NodePublishVolumeRequest")) != wrong


def test_stubs_are_generated_from_the_committed_proto():
    """The .proto beside the stubs is the one they were generated from (same descriptor)."""
    grpc_tools = pytest.importorskip("grpc_tools")
    import os
    import subprocess
    import sys
    import tempfile
    src = Path(csi_pb2.__file__).resolve().parents[3]
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{src}", f"-I{include}",
                        f"--descriptor_set_out={out}/d.pb", "bootseer/csi/proto/csi.proto"],
                       check=True, cwd=src)
        from google.protobuf import descriptor_pb2
        fresh = descriptor_pb2.FileDescriptorSet.FromString(Path(f"{out}/d.pb").read_bytes())
    ours = descriptor_pb2.FileDescriptorProto.FromString(csi_pb2.DESCRIPTOR.serialized_pb)
    theirs = fresh.file[0]
    _drop_json_names(theirs)   # a descriptor set carries them, the generated code does not
    assert theirs == ours


def _drop_json_names(proto) -> None:
    for m in proto.message_type:
        _drop_message_json_names(m)


def _drop_message_json_names(m) -> None:
    for f in m.field:
        f.ClearField("json_name")
    for n in m.nested_type:
        _drop_message_json_names(n)
