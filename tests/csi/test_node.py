"""The node plugin as the kubelet drives it: ``bootseer csi serve`` in a process of its
own, a real gRPC client on its unix socket (NodeGetInfo, NodePublishVolume,
NodeUnpublishVolume), real kernel mounts of a published environment, a checkpoint served
striped from nginx, and the answers to a pod that must wait on a build or asks for what it
must not have."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")

from bootseer.csi.proto import csi_pb2, csi_pb2_grpc  # noqa: E402
from bootseer.deps.lease import Lease  # noqa: E402
from bootseer.deps.snapshot import publish  # noqa: E402
from bootseer.node import mounts  # noqa: E402
from bootseer.store import open_store  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
KEY = "sha256:" + "c5" * 32
PREFIX = "/opt/envs/train"   # where the pod mounts the volume: the environment's prefix


class Plugin:
    """``bootseer csi serve`` on a short socket path, its kubelet directory under the
    test's, and a client of its Identity and Node services."""

    def __init__(self, tmp_path: Path, build_wait_s: float = 2.0):
        self.top = Path(f"/tmp/bcsi-{uuid.uuid4().hex[:8]}")   # sun_path is short
        self.top.mkdir()
        self.sock = self.top / "csi.sock"
        self.kubelet = tmp_path / "kubelet"
        self.store = tmp_path / "store"
        env = dict(os.environ, BOOTSEER_CACHE_DIR=str(tmp_path / "cache"))
        self.log = open(tmp_path / "plugin.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bootseer", "csi", "serve", "--endpoint",
             f"unix://{self.sock}", "--node-id", "node-7", "--kubelet-dir", str(self.kubelet),
             "--state-dir", str(tmp_path / "state"), "--store", str(self.store),
             "--build-wait", str(build_wait_s)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while not self.sock.exists():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, "the plugin did not listen"
            time.sleep(0.05)
        self.channel = grpc.insecure_channel(f"unix://{self.sock}")
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def target(self, name: str) -> Path:
        """Where the kubelet publishes a pod's volume ``name`` (it makes the parent)."""
        parent = self.kubelet / "pods" / uuid.uuid4().hex / "volumes/kubernetes.io~csi" / name
        parent.mkdir(parents=True)
        return parent / "mount"

    def publish(self, target, context: dict, volume_id: str = "csi-0a1b"):
        cap = csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(),
            access_mode=csi_pb2.VolumeCapability.AccessMode(
                mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER))
        ctx = {"csi.storage.k8s.io/ephemeral": "true", "csi.storage.k8s.io/pod.name": "p",
               "csi.storage.k8s.io/pod.namespace": "ml", **context}
        return self.node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
            volume_id=volume_id, target_path=str(target), volume_capability=cap,
            readonly=True, volume_context=ctx), timeout=60)

    def unpublish(self, target, volume_id: str = "csi-0a1b"):
        return self.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id=volume_id, target_path=str(target)), timeout=60)

    def stop(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.top, ignore_errors=True)


@pytest.fixture
def plugin(tmp_path):
    p = Plugin(tmp_path)
    yield p
    p.stop()


def publish_env(store: Path, key: str = KEY) -> dict[str, bytes]:
    """An environment published under ``key`` (made at PREFIX) the way a builder does."""
    src = store.parent / f"built-{key[7:15]}"
    files = {"bin/tool": b"#!/bin/sh\necho hi\n",
             "lib/python3.11/site-packages/bsx/__init__.py": b"X = 1\n" * 999}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    publish(open_store(str(store)), PREFIX, key, root=str(src))
    return files


def status_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def test_identity_and_node_info(plugin):
    info = plugin.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name == "csi.bootseer.dev" and info.vendor_version
    assert plugin.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True
    assert list(plugin.identity.GetPluginCapabilities(
        csi_pb2.GetPluginCapabilitiesRequest()).capabilities) == []
    assert plugin.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).node_id == "node-7"
    caps = plugin.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    assert list(caps.capabilities) == []    # no stage: the kubelet publishes directly


@pytest.mark.usefixtures("need_root")
def test_an_environment_is_published_idempotently_and_unpublished_clean(plugin):
    files = publish_env(plugin.store)
    target = plugin.target("env")
    plugin.publish(target, {"environment": KEY})
    assert mounts.is_mount_point(str(target))
    first = mounts.find(str(target))
    assert first is not None and first.fstype == "erofs"
    for rel, data in files.items():
        assert (target / rel).read_bytes() == data
    with pytest.raises(OSError):
        (target / "new").write_text("x")     # read-only
    plugin.publish(target, {"environment": KEY})      # the kubelet retries: same mount
    assert mounts.find(str(target)).mount_id == first.mount_id
    code, details = status_of(lambda: plugin.publish(
        target, {"checkpoint": "https://ckpt.example/x/"}))
    assert code == grpc.StatusCode.ALREADY_EXISTS, details
    plugin.unpublish(target)
    assert not target.exists()
    assert os.listdir(target.parent) == []       # nothing beside it for the kubelet to trip on
    plugin.unpublish(target)                     # again: OK, nothing to do


@pytest.mark.usefixtures("need_fuse")
def test_a_checkpoint_is_published_striped_and_unpublished(plugin, nginx_factory, tmp_path):
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    big = os.urandom(3 * 1024 * 1024 + 17)
    (d / "model.bin").write_bytes(big)
    (d / "sub/opt.bin").write_bytes(b"tiny")
    server = nginx_factory(d)
    target = plugin.target("ckpt")
    plugin.publish(target, {"checkpoint": f"{server.url}/"})
    assert mounts.is_mount_point(str(target))
    assert (target / "model.bin").read_bytes() == big
    assert (target / "sub/opt.bin").read_bytes() == b"tiny"
    plugin.publish(target, {"checkpoint": f"{server.url}/"})    # idempotent
    plugin.unpublish(target)
    assert not target.exists() and not mounts.is_mount_point(str(target))
    code, details = status_of(lambda: plugin.publish(plugin.target("gone"),
                                                     {"checkpoint": f"{server.url}/nope/"}))
    assert code == grpc.StatusCode.NOT_FOUND, details


@pytest.mark.usefixtures("need_root")
def test_a_volume_waits_on_its_environments_build(plugin):
    """The key is being built elsewhere (its lease is held): the publish waits up to
    --build-wait and answers UNAVAILABLE (the kubelet retries); once published, the next
    call mounts it, and one made while the build finishes waits for it and succeeds."""
    store = open_store(str(plugin.store))
    lease = Lease(store, KEY)
    assert lease.acquire()
    try:
        target = plugin.target("env")
        t0 = time.monotonic()
        code, details = status_of(lambda: plugin.publish(target, {"environment": KEY}))
        assert code == grpc.StatusCode.UNAVAILABLE, details
        assert "being built" in details and "\n" not in details
        assert time.monotonic() - t0 >= 1.5            # it waited (--build-wait 2)
        assert not target.exists()
        builder = threading.Timer(0.5, publish_env, (plugin.store,))
        builder.start()
        plugin.publish(target, {"environment": KEY})    # waits for the publish
        builder.join()
    finally:
        lease.release()
    assert (target / "bin/tool").read_bytes().startswith(b"#!/bin/sh")
    plugin.unpublish(target)
    code, details = status_of(lambda: plugin.publish(plugin.target("other"),
                                                     {"environment": "sha256:" + "0" * 64}))
    assert code == grpc.StatusCode.NOT_FOUND and "deps ensure" in details


@pytest.mark.parametrize("context, target, why", [
    ({"environment": "sha256:../../etc"}, None, "not an environment key"),
    ({"environment": KEY, "hostPath": "/"}, None, "unknown volume attribute 'hostPath'"),
    ({"checkpoint": "file:///etc/"}, None, "not one of http"),
    ({"environment": KEY}, "/etc/cron.d", "not under"),
    ({"environment": KEY}, "{kubelet}/pods/x/../../../../etc", "not a normal path"),
])
def test_hostile_attributes_are_invalid_argument_in_one_line(plugin, context, target, why):
    target = (target or str(plugin.target("h"))).format(kubelet=plugin.kubelet)
    code, details = status_of(lambda: plugin.publish(target, context))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert why in details and "\n" not in details
    assert not os.path.exists("/etc/cron.d/mount")


def test_a_block_volume_and_an_unpublish_outside_the_pods_dir_are_refused(plugin):
    req = csi_pb2.NodePublishVolumeRequest(
        volume_id="csi-1", target_path=str(plugin.target("b")),
        volume_capability=csi_pb2.VolumeCapability(block=csi_pb2.VolumeCapability.BlockVolume()),
        volume_context={"environment": KEY})
    code, details = status_of(lambda: plugin.node.NodePublishVolume(req, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "block" in details
    code, details = status_of(lambda: plugin.unpublish("/tmp"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "not under" in details
    assert os.path.isdir("/tmp")


def test_a_second_plugin_on_the_same_socket_is_refused(plugin, tmp_path):
    p = subprocess.run([sys.executable, "-m", "bootseer", "csi", "serve", "--endpoint",
                        f"unix://{plugin.sock}", "--state-dir", str(tmp_path / "s2"),
                        "--kubelet-dir", str(plugin.kubelet)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "already serves" in p.stderr and len(p.stderr.strip().splitlines()) <= 2


@pytest.mark.usefixtures("need_root")
def test_an_environment_outlives_a_plugin_restart_and_is_unpublished_by_the_next(tmp_path):
    """Kernel mounts need no server: the next plugin finds the volume from its record,
    answers the kubelet's repeated publish at once and unpublishes it clean."""
    first = Plugin(tmp_path)
    try:
        publish_env(first.store)
        target = first.target("env")
        first.publish(target, {"environment": KEY})
        mount_id = mounts.find(str(target)).mount_id
    finally:
        first.stop()
    assert mounts.find(str(target)).mount_id == mount_id     # still there
    second = Plugin(tmp_path)
    try:
        second.publish(target, {"environment": KEY})
        assert mounts.find(str(target)).mount_id == mount_id
        second.unpublish(target)
        assert not target.exists() and os.listdir(target.parent) == []
    finally:
        second.stop()
