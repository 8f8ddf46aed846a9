"""Converted images through containerd's CRI, as the kubelet starts pods: no layer is
downloaded, the container runs from the lazily mounted tree, the start's hot blocks are
recorded and published, and a second node prefetches them."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from bootseer.testing.containerd import push_pause
from tests.conftest import need
from tests.snapshotter.test_containerd import push_two_layers
from tests.snapshotter.test_metrics import get, samples

READY = "/tmp/bootseer-ready"
JOB = ["sh", "-c", "cat /data/b.txt /data/keep.txt; test -e /data/a.txt && echo WRONG; "
                   f"wc -c < /data/payload.bin; touch {READY}"]


@pytest.fixture
def converted(registry, busybox_rootfs, tmp_path):
    """(image, pause image, store, tree): the layered image converted into a local store."""
    need(shutil.which("skopeo") is not None, "skopeo is not installed")
    pause = push_pause(None, f"127.0.0.1:{registry.port}", tmp_path)
    (busybox_rootfs / "data").mkdir(exist_ok=True)
    (busybox_rootfs / "data/payload.bin").write_bytes(os.urandom(3 << 20))
    image = push_two_layers(registry, busybox_rootfs, tmp_path)
    store = str(tmp_path / "store")
    from bootseer.image.convert import convert
    from bootseer.store import open_store
    tree = convert(image, open_store(store))
    return image, pause, store, tree


def test_a_pod_on_a_converted_image_starts_lazily_and_the_next_node_prefetches(
        nodes, converted, registry, tmp_path):
    from bootseer.store import open_store
    from bootseer.tree import profile as prof
    from tests.support.cri.pods import CriClient
    image, pause, store, tree = converted
    host = f"127.0.0.1:{registry.port}"

    def node(name: str):
        """A fresh node: its own containerd, snapshotter root and node cache."""
        n = nodes(name, snapshotter_args=["--store", store, "--window", "60",
                                          "--ready-file", READY],
                  env={"BOOTSEER_CACHE_DIR": str(tmp_path / f"cache-{name}")},
                  cri=(pause, host))
        return n, CriClient(n.containerd.sock)

    n1, c1 = node("a")
    try:
        c1.pull(image)
        # No layer of the converted image was downloaded into containerd's content store;
        # its layer snapshots are the chain IDs recorded at convert time.
        content = n1.containerd.ctr("content", "ls", namespace="k8s.io").stdout
        blobs = {line.split()[0] for line in content.splitlines()[1:]}
        assert blobs and not blobs & set(_layers(image)), content
        snaps = n1.containerd.ctr("snapshots", "--snapshotter", "bootseer", "ls",
                                  namespace="k8s.io").stdout
        chains = _tree_meta(store, tree)["chain_ids"]
        assert len(chains) == 2 and all(c in snaps for c in chains)
        code, out = c1.run(image, JOB, str(tmp_path / "logs-a"))
        assert code == 0, out
        assert out == ["from layer two", "kept", str(3 << 20)], out
        # The ready file closed the window: the profile is published.
        deadline = time.monotonic() + 30
        while prof.latest(open_store(store), tree) is None:
            assert time.monotonic() < deadline, n1.snapshotter.log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        c1.close()

    n2, c2 = node("b")
    try:
        c2.pull(image)
        code, out = c2.run(image, JOB, str(tmp_path / "logs-b"))
        assert code == 0 and out[0] == "from layer two", out
        assert "prefetching" in n2.snapshotter.log.read_text()
    finally:
        c2.close()


def _layers(image: str) -> list[str]:
    import json
    r = subprocess.run(["skopeo", "inspect", "--tls-verify=false", f"docker://{image}"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["Layers"]


def _tree_meta(store: str, tree: str) -> dict:
    from bootseer.config import BootseerConfig
    from bootseer.store import open_store
    from bootseer.store.cache import NodeCache
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import load_toc
    config = BootseerConfig.from_env(overrides={"store": {"url": store}})
    with Fetcher(config.fetch) as f:
        return load_toc(open_store(store), tree, f, NodeCache(config.cache)).meta


def test_an_unreachable_store_falls_back_to_a_normal_pull(nodes, converted, registry, tmp_path):
    from tests.support.cri.pods import CriClient
    image, pause, _, _ = converted
    n = nodes("u", snapshotter_args=["--store", "http://127.0.0.1:9/none"],
              env={"BOOTSEER_FETCH_RETRIES": "0"}, cri=(pause, f"127.0.0.1:{registry.port}"))
    c = CriClient(n.containerd.sock)
    try:
        c.pull(image)
        code, out = c.run(image, JOB, str(tmp_path / "logs"))
        assert code == 0 and out[:2] == ["from layer two", "kept"], out
        content = n.containerd.ctr("content", "ls", namespace="k8s.io").stdout
        assert set(_layers(image)) <= {line.split()[0] for line in content.splitlines()[1:]}
        assert "pulling its layers" in n.snapshotter.log.read_text()
    finally:
        c.close()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STRIDE, READS = 64 << 10, 48   # 4 KiB reads this far apart: each one new to the page cache


def test_running_containers_read_their_image_through_snapshotter_restarts(
        nodes, converted, registry, busybox_rootfs, tmp_path):
    """A container reads uncached parts of its lazily mounted image while the snapshotter
    is stopped (SIGTERM) and a new one started, then SIGKILLed and started again: every
    read returns the right bytes (the trees' holders outlive the snapshotter and are
    adopted), the snapshots listed are the same, and a new pod runs after."""
    import hashlib
    import signal
    import threading

    from tests.support.cri.pods import CriClient
    image, pause, store, _ = converted
    payload = (busybox_rootfs / "data/payload.bin").read_bytes()
    want = [hashlib.md5(payload[i * STRIDE:i * STRIDE + 4096]).hexdigest()
            for i in range(READS)]
    port = free_port()
    n = nodes("r", snapshotter_args=["--store", store, "--metrics-addr", f"127.0.0.1:{port}"],
              cri=(pause, f"127.0.0.1:{registry.port}"),
              env={"BOOTSEER_CACHE_DIR": str(tmp_path / "cache")})
    c = CriClient(n.containerd.sock)

    def snapshots() -> str:
        deadline = time.monotonic() + 30   # containerd redials a restarted proxy
        while True:
            r = n.containerd.ctr("snapshots", "--snapshotter", "bootseer", "ls",
                                 namespace="k8s.io", check=False)
            if r.returncode == 0 or time.monotonic() > deadline:
                assert r.returncode == 0, r.stderr
                return "\n".join(sorted(r.stdout.splitlines()))
            time.sleep(0.3)

    try:
        c.pull(image)
        reader = ["sh", "-c", f"cat /data/keep.txt; i=0; while [ $i -lt {READS} ]; do "
                  f"echo $i $(dd if=/data/payload.bin bs=4096 count=1 "
                  f"skip=$((i * {STRIDE // 4096})) 2>/dev/null | md5sum); sleep 0.4; "
                  f"i=$((i + 1)); done"]
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(
            r=c.run(image, reader, str(tmp_path / "logs1"))))
        t.start()
        log = tmp_path / "logs1/job.log"

        def lines() -> int:
            return log.read_text().count("\n") if log.exists() else 0
        deadline = time.monotonic() + 60
        while lines() < 3:   # it runs, and reads
            assert time.monotonic() < deadline and t.is_alive(), result
            time.sleep(0.1)
        before = snapshots()
        for sig in (signal.SIGTERM, signal.SIGKILL):   # an upgrade, then a crash
            seen = lines()
            n.snapshotter.stop(sig)
            n.snapshotter.start()
            assert snapshots() == before
            deadline = time.monotonic() + 30
            while lines() < seen + 2:   # reads go on, through the adopted mount
                assert time.monotonic() < deadline and t.is_alive(), result
                time.sleep(0.1)
        t.join(120)
        code, out = result["r"]
        got = [line.split()[1] if len(line.split()) > 1 else line for line in out[1:]]
        assert code == 0 and out[0] == "kept" and got == want, out
        assert "adopted" in n.snapshotter.log.read_text()
        _, text = get(port, "/metrics")   # the tree goes on, served and counted
        got = samples(text)
        assert got["bootseer_snapshotter_trees_served"] == 1, text
        assert got['bootseer_snapshotter_mounts_total{how="adopted"}'] == 1, text
        assert got["bootseer_snapshotter_cache_hits_total"] + \
            got["bootseer_snapshotter_cache_misses_total"] > 0, text
        assert get(port, "/readyz") == (200, "ready\n")
        code, out = c.run(image, JOB, str(tmp_path / "logs2"))
        assert code == 0 and out[0] == "from layer two", out
    finally:
        c.close()


def test_labels_from_an_image_never_escape_the_root(converted, tmp_path):
    """Malformed or hostile labels and keys are ordinary names: directories are numbered
    below the root, store refs are never built from them; another image stacked on a
    placeholder layer is refused."""
    import grpc

    from bootseer.config import BootseerConfig
    from bootseer.snapshotter.lazy import CRI_MANIFEST, REF, LazyImages
    from bootseer.snapshotter.proto import snapshots_pb2 as pb
    from bootseer.snapshotter.proto import snapshots_pb2_grpc
    from bootseer.snapshotter.server import SnapshotterServer
    image, _, store, tree = converted
    config = BootseerConfig.from_env(overrides={"store": {"url": store},
                                                "cache": {"dir": str(tmp_path / "cache")}})
    root = tmp_path / "root"
    sock = f"/tmp/bsh-{tmp_path.name[-8:]}.sock"
    server = SnapshotterServer(sock, str(root), lazy=LazyImages(config)).start()
    try:
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            stub = snapshots_pb2_grpc.SnapshotsStub(ch)
            hostile = {REF: "../../../../etc", CRI_MANIFEST: "sha256:../../x"}
            stub.Prepare(pb.PrepareSnapshotRequest(key="../../escape", labels=hostile))
            assert sorted(os.listdir(root / "snapshots")) == ["1"]
            assert not (tmp_path / "escape").exists()
            # The image's bottom layer, as containerd's unpacker prepares it:
            meta = _tree_meta(store, tree)
            manifest = meta["manifest"]
            with pytest.raises(grpc.RpcError) as e:
                stub.Prepare(pb.PrepareSnapshotRequest(
                    key="extract-1", labels={REF: meta["chain_ids"][0], CRI_MANIFEST: manifest}))
            assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
            info = stub.Stat(pb.StatSnapshotRequest(key=meta["chain_ids"][0])).info
            assert info.labels["bootseer.dev/tree"] == tree
            with pytest.raises(grpc.RpcError) as e:   # another image on the placeholder
                stub.Prepare(pb.PrepareSnapshotRequest(
                    key="extract-2", parent=meta["chain_ids"][0],
                    labels={REF: "sha256:" + "1" * 64}))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "placeholder" in e.value.details()
    finally:
        server.stop(grace=0)
