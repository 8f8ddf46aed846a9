"""The snapshotter behind a real containerd: pulls and runs a multi-layer image (with a
whiteout) through ``ctr``, survives its own restart, refuses what containerd's
semantics refuse."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.conftest import need


def push_two_layers(registry, busybox_rootfs, tmp_path) -> str:
    """Layer 1: busybox + /data/a.txt + /data/keep.txt; layer 2 deletes a.txt (a whiteout)
    and adds b.txt, so the rootfs is only right if the layers stack in order. The layers are
    written as tars (no container runs to make them) and pushed by skopeo."""
    import io
    import tarfile

    from tests.image.test_image import oci_layout, tar_layer
    need(shutil.which("skopeo") is not None, "skopeo is not installed")
    ref = f"127.0.0.1:{registry.port}/test/layered:1"
    (busybox_rootfs / "data").mkdir(exist_ok=True)
    (busybox_rootfs / "data/a.txt").write_text("from layer one\n")
    (busybox_rootfs / "data/keep.txt").write_text("kept\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for entry in sorted(busybox_rootfs.iterdir()):
            t.add(entry, arcname=entry.name)
    top = tar_layer([("data/.wh.a.txt", b"", "f"), ("data/b.txt", b"from layer two\n", "f")])
    layout = oci_layout(tmp_path / "layered-oci", [buf.getvalue(), top])
    subprocess.run(["skopeo", "copy", "-q", "--dest-tls-verify=false", f"oci:{layout}",
                    f"docker://{ref}"], check=True, capture_output=True)
    return ref


@pytest.fixture
def layered_image(registry, busybox_rootfs, tmp_path):
    return push_two_layers(registry, busybox_rootfs, tmp_path)


CHECK = "cat /data/b.txt /data/keep.txt; test -e /data/a.txt && echo WRONG; echo ok > /w; cat /w"


def pull_and_run(ctd, ref: str, name: str) -> str:
    ctd.ctr("images", "pull", "--plain-http", "--snapshotter", "bootseer", ref)
    r = ctd.ctr("run", "--rm", "--snapshotter", "bootseer", ref, name, "sh", "-c", CHECK)
    return r.stdout


def test_pull_and_run_a_layered_image(containerd, layered_image):
    out = pull_and_run(containerd, layered_image, "t1")
    assert out.split() == ["from", "layer", "two", "kept", "ok"]
    snaps = containerd.ctr("snapshots", "--snapshotter", "bootseer", "ls").stdout
    assert snaps.count("Committed") == 2   # one committed snapshot per layer


def test_restart_of_the_snapshotter(containerd, layered_image):
    """Killed (SIGKILL) and restarted: records survive, containerd's next calls work, new
    containers on the same layers start."""
    containerd.ctr("images", "pull", "--plain-http", "--snapshotter", "bootseer", layered_image)
    snap = containerd.snapshotter
    snap.stop(signal.SIGKILL)
    snap.start()
    deadline = time.monotonic() + 30   # containerd redials the proxy with a backoff
    while containerd.ctr("snapshots", "--snapshotter", "bootseer", "ls",
                         check=False).returncode != 0:
        assert time.monotonic() < deadline, "containerd never reconnected to the snapshotter"
        time.sleep(0.5)
    r = containerd.ctr("run", "--rm", "--snapshotter", "bootseer", layered_image, "t2",
                       "sh", "-c", CHECK)
    assert r.stdout.split() == ["from", "layer", "two", "kept", "ok"]


def test_image_removal_frees_every_snapshot(containerd, layered_image):
    """containerd's garbage collector removes the layers through the snapshotter's Remove
    (children first): nothing is left in its root."""
    out = pull_and_run(containerd, layered_image, "t3")
    assert "ok" in out
    containerd.ctr("images", "rm", "--sync", layered_image)
    listed = containerd.ctr("snapshots", "--snapshotter", "bootseer", "ls").stdout
    assert listed.splitlines()[1:] == []
    assert os.listdir(containerd.snapshotter.root / "snapshots") == []


def test_the_deployed_containerd_config_loads_the_snapshotter(nodes, tmp_path):
    """deploy/kubernetes/containerd-bootseer.toml, as a node merges it, in a real containerd:
    the proxy plugin is loaded and the CRI plugin starts with it as its snapshotter."""
    from pathlib import Path

    from bootseer.testing.containerd import wait_socket
    snippet = (Path(__file__).resolve().parents[2]
               / "deploy/kubernetes/containerd-bootseer.toml").read_text()
    node = nodes("cfg")
    base = node.base / "deployed"
    base.mkdir()
    sock = f"{base}/c.sock"
    config = snippet.replace("/run/bootseer/snapshotter.sock", node.snapshotter.sock).replace(
        "version = 2\n", f'version = 2\nroot = "{base}/root"\nstate = "{base}/state"\n'
                         f'[grpc]\n  address = "{sock}"\n', 1)
    (base / "config.toml").write_text(config)
    log = base / "containerd.log"
    proc = subprocess.Popen(["containerd", "--config", str(base / "config.toml")],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_socket(sock, proc, log)
        plugins = subprocess.run(["ctr", "--address", sock, "plugins", "ls"], capture_output=True,
                                 text=True, check=True).stdout.splitlines()
        row = {tuple(p.split()[:2]): p.split()[-1] for p in plugins[1:]}
        assert row[("io.containerd.snapshotter.v1", "bootseer")] == "ok"
        assert row[("io.containerd.grpc.v1", "cri")] == "ok"
        assert "Snapshotter:bootseer" in log.read_text()   # the CRI's own config dump
    finally:
        proc.terminate()
        proc.wait(timeout=30)
