"""Two ``bootseer run`` "nodes" of one job, each on its own 127.0.0.x address with its own
node cache, start a converted image with peers ``auto``: nobody sets
``BOOTSEER_PEERS_NODES``, the node count comes from the launcher (Slurm's count on one,
``--nodes`` on the other), and the second node's trace shows its hot set came from the
first."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

from tests.conftest import BUSYBOX
from tests.image.test_image import oci_layout, tar_layer

pytestmark = pytest.mark.timeout(240)


def bootseer(*args, env):
    return subprocess.Popen([sys.executable, "-m", "bootseer", *args], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def done(proc) -> tuple[str, str]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out, err


def busybox_layer() -> bytes:
    """A layer with the busybox binary, executable (tar_layer makes files 0644)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        ti = t.gettarinfo(BUSYBOX, arcname="bin/busybox")
        ti.mode, ti.uid, ti.gid = 0o755, 0, 0
        with open(BUSYBOX, "rb") as f:
            t.addfile(ti, f)
    return buf.getvalue()


def node_env(tmp_path, name: str, addr: str) -> dict:
    return {"BOOTSEER_CACHE_DIR": str(tmp_path / name / "cache"),
            "BOOTSEER_PEERS_INTERFACE": addr, "BOOTSEER_PEERS_MIN_SET_BYTES": "0",
            "BOOTSEER_PEERS_PORT_MIN": "21700", "BOOTSEER_PEERS_PORT_MAX": "21799",
            "BOOTSEER_MOUNT_BACKEND": "fuse"}


def test_two_run_nodes_share_the_hot_set_with_peers_auto(need_fuse, tmp_path):
    if not os.path.exists(BUSYBOX):
        pytest.skip("busybox-static is not installed")
    layout = tmp_path / "layout"
    layout.mkdir()
    members = [("bin", None, "d"), ("data", None, "d")]
    members += [(f"bin/{tool}", None, "l:busybox")
                for tool in ("sh", "env", "cat", "sleep", "touch")]
    members += [(f"data/d{i}", os.urandom(1 << 20), "f") for i in range(4)]   # the hot set
    oci_layout(layout, [tar_layer(members), busybox_layer()])
    store = str(tmp_path / "store")
    conv = subprocess.run([sys.executable, "-m", "bootseer", "image", "convert", str(layout),
                           "--store", store], capture_output=True, text=True)
    assert conv.returncode == 0, conv.stderr
    tree = conv.stdout.strip().splitlines()[-1]
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    trace = str(tmp_path / "trace")
    common = ["run", "--image", tree, "--store", store, "--runtime", "chroot", "--trace", trace,
              "--ready-regex", "^ready$", "--bind", f"{ctl}:/ctl:rw"]
    read_all = "cat /data/* >/dev/null; echo ready"

    # a first start of one node records the hot set (peers auto: off for one node)
    done(bootseer(*common, "--job-id", "rec", "--node", "rec", "--", "sh", "-c", read_all,
                  env=node_env(tmp_path, "rec", "127.0.0.40")))

    # the job's two nodes: A holds its seed until the test says stop
    a = bootseer(*common, "--job-id", "pair", "--node", "a", "--", "sh", "-c",
                 f"{read_all}; touch /ctl/a-ready; while [ ! -e /ctl/stop ]; do sleep 0.1; done",
                 env={**node_env(tmp_path, "a", "127.0.0.41"), "SLURM_NNODES": "2"})
    try:
        deadline = time.time() + 60
        while not (ctl / "a-ready").exists():
            assert a.poll() is None and time.time() < deadline, a.stderr.read()
            time.sleep(0.1)
        b = bootseer(*common, "--job-id", "pair", "--node", "b", "--nodes", "2", "--", "sh",
                     "-c", f"sleep 3; {read_all}", env=node_env(tmp_path, "b", "127.0.0.42"))
        done(b)
    finally:
        (ctl / "stop").touch()
    done(a)

    from bootseer.report import load as trace_load
    windows = {e["node"]: e["attrs"] for e in trace_load.load(trace).events
               if e.get("phase") == "image.window"}
    # the recording start published the torrent with the profile: both nodes join it
    assert windows["a"].get("prefetch_peers_role") == "peer", sorted(windows["a"].items())
    assert windows["b"]["prefetch_peers_role"] == "peer", windows["b"]
    assert windows["b"]["prefetch_peer_bytes"] >= 4 << 20
    assert windows["b"]["prefetch_origin_bytes"] == 0
    assert "prefetch_peer_bytes" not in windows["rec"] or windows["rec"]["prefetch_peer_bytes"] == 0
    shutil.rmtree(tmp_path / "store", ignore_errors=True)
