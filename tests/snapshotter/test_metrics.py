"""The snapshotter's metrics and probes (``--metrics-addr``), scraped over HTTP as
Prometheus and a kubelet do: the snapshot and error figures follow the calls made."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import pytest

from bootseer.snapshotter.proto import snapshots_pb2 as pb
from bootseer.snapshotter.proto import snapshots_pb2_grpc
from bootseer.snapshotter.server import SnapshotterServer


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_metrics_and_probes_follow_the_calls(tmp_path):
    sock = f"/tmp/bsm-{tmp_path.name[-8:]}.sock"
    server = SnapshotterServer(sock, str(tmp_path / "root"), metrics_addr="127.0.0.1:0")
    assert server.metrics is not None
    port = server.metrics.port
    server.start()
    try:
        assert get(port, "/healthz") == (200, "ok\n")
        assert get(port, "/readyz") == (200, "ready\n")
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            stub = snapshots_pb2_grpc.SnapshotsStub(ch)
            stub.Prepare(pb.PrepareSnapshotRequest(key="a"))
            stub.Commit(pb.CommitSnapshotRequest(name="base", key="a"))
            stub.Prepare(pb.PrepareSnapshotRequest(key="b", parent="base"))
            with pytest.raises(grpc.RpcError):
                stub.Stat(pb.StatSnapshotRequest(key="missing"))
        code, text = get(port, "/metrics")
        assert code == 200 and "# TYPE bootseer_snapshotter_snapshots gauge" in text
        got = samples(text)
        assert got['bootseer_snapshotter_snapshots{kind="committed"}'] == 1
        assert got['bootseer_snapshotter_snapshots{kind="active"}'] == 1
        assert got['bootseer_snapshotter_errors_total{code="NOT_FOUND"}'] == 1
        assert get(port, "/nothing")[0] == 404
    finally:
        server.stop(grace=0)
    with pytest.raises(OSError):   # stopped: the endpoint is gone with it
        get(port, "/healthz")


@pytest.mark.parametrize("addr", ["nonsense", "127.0.0.1:99999"])
def test_a_bad_metrics_address_is_refused_in_one_line(tmp_path, addr):
    r = subprocess.run([sys.executable, "-m", "bootseer", "snapshotter", "serve",
                        "--address", f"/tmp/bsm-{tmp_path.name[-8:]}.sock",
                        "--root", str(tmp_path / "root"), "--metrics-addr", addr],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) <= 2 and "--metrics-addr" in r.stderr and "hint" in r.stderr, r.stderr
    assert not (tmp_path / "root").exists()   # refused before anything was made
