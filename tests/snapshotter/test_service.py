"""containerd's snapshot semantics, spoken to the server over its unix socket with the
generated stubs (as containerd's proxy client speaks): kinds, parents, error codes, label
updates, filters, usage, crash leftovers, in-use refusal."""

from __future__ import annotations

import os
import subprocess

import grpc
import pytest
from google.protobuf import field_mask_pb2

from bootseer.errors import UsageError
from bootseer.snapshotter.proto import snapshots_pb2 as pb
from bootseer.snapshotter.proto import snapshots_pb2_grpc
from bootseer.snapshotter.server import SnapshotterServer
from tests.conftest import is_root, need


@pytest.fixture
def client(tmp_path):
    sock = f"/tmp/bss-{tmp_path.name[-8:]}.sock"
    server = SnapshotterServer(sock, str(tmp_path / "root")).start()
    channel = grpc.insecure_channel(f"unix://{sock}")
    stub = snapshots_pb2_grpc.SnapshotsStub(channel)
    stub.root = tmp_path / "root"
    stub.sock = sock
    yield stub
    channel.close()
    server.stop(grace=0)


def code(fn, *args, **kw) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn(*args, **kw)
    return e.value.code()


def prepare(stub, key, parent="", **labels):
    return stub.Prepare(pb.PrepareSnapshotRequest(key=key, parent=parent, labels=labels)).mounts


def commit(stub, name, key, **labels):
    stub.Commit(pb.CommitSnapshotRequest(name=name, key=key, labels=labels))


def test_kinds_parents_and_mounts(client):
    m = prepare(client, "a")
    assert [(x.type, list(x.options)) for x in m] == [("bind", ["rw", "rbind"])]
    open(os.path.join(m[0].source, "f"), "w").write("x")
    commit(client, "A", "a")
    assert client.Stat(pb.StatSnapshotRequest(key="A")).info.kind == pb.COMMITTED
    assert code(client.Stat, pb.StatSnapshotRequest(key="a")) == grpc.StatusCode.NOT_FOUND
    m = prepare(client, "b", "A")
    assert m[0].type == "overlay"
    opts = dict(o.partition("=")[::2] for o in m[0].options)
    assert opts["lowerdir"].endswith("/fs") and "upperdir" in opts and "workdir" in opts
    commit(client, "B", "b")
    v = client.View(pb.ViewSnapshotRequest(key="v", parent="B")).mounts
    assert v[0].type == "overlay" and "ro" in v[0].options
    assert len(dict(o.partition("=")[::2] for o in v[0].options)["lowerdir"].split(":")) == 2
    v1 = client.View(pb.ViewSnapshotRequest(key="v1", parent="A")).mounts
    assert (v1[0].type, list(v1[0].options)) == ("bind", ["ro", "rbind"])
    assert client.Mounts(pb.MountsRequest(key="v")).mounts == v
    usage = client.Usage(pb.UsageRequest(key="A"))
    assert usage.inodes == 1 and usage.size > 0


def test_error_codes(client):
    prepare(client, "a")
    C = grpc.StatusCode
    assert code(prepare, client, "a") == C.ALREADY_EXISTS
    assert code(prepare, client, "x", "missing") == C.NOT_FOUND
    assert code(prepare, client, "x", "a") == C.INVALID_ARGUMENT       # parent not committed
    assert code(prepare, client, "") == C.INVALID_ARGUMENT
    assert code(prepare, client, "big", "", k="v" * 5000) == C.INVALID_ARGUMENT
    commit(client, "A", "a")
    assert code(client.Mounts, pb.MountsRequest(key="A")) == C.FAILED_PRECONDITION
    client.View(pb.ViewSnapshotRequest(key="v", parent="A"))
    assert code(commit, client, "V", "v") == C.FAILED_PRECONDITION     # a view never commits
    prepare(client, "b", "A")
    assert code(commit, client, "A", "b") == C.ALREADY_EXISTS
    assert code(client.Remove, pb.RemoveSnapshotRequest(key="A")) == C.FAILED_PRECONDITION
    client.Remove(pb.RemoveSnapshotRequest(key="b"))
    client.Remove(pb.RemoveSnapshotRequest(key="v"))
    client.Remove(pb.RemoveSnapshotRequest(key="A"))
    assert code(client.Remove, pb.RemoveSnapshotRequest(key="A")) == C.NOT_FOUND
    assert os.listdir(client.root / "snapshots") == []


def test_labels_update_and_list_filters(client):
    prepare(client, "a", **{"containerd.io/gc.root": "x", "team": "ml"})
    commit(client, "A", "a", **{"containerd.io/gc.root": "x", "team": "ml"})
    prepare(client, "b", "A", team="infra")
    info = pb.Info(name="A", labels={"team": "research"})
    got = client.Update(pb.UpdateSnapshotRequest(
        info=info, update_mask=field_mask_pb2.FieldMask(paths=["labels.team"]))).info
    assert dict(got.labels) == {"containerd.io/gc.root": "x", "team": "research"}
    got = client.Update(pb.UpdateSnapshotRequest(info=pb.Info(name="A", labels={"n": "1"}))).info
    assert dict(got.labels) == {"n": "1"}                                # no mask: all labels
    assert code(client.Update, pb.UpdateSnapshotRequest(
        info=info, update_mask=field_mask_pb2.FieldMask(paths=["parent"]))) == \
        grpc.StatusCode.INVALID_ARGUMENT

    def names(*filters):
        return sorted(i.name for r in client.List(pb.ListSnapshotsRequest(filters=filters))
                      for i in r.info)
    assert names() == ["A", "b"]
    assert names("kind==committed") == ["A"]
    assert names('labels."team"==infra') == ["b"]
    assert names("labels.n") == ["A"]
    assert names("parent==A,kind==active") == ["b"]
    assert names("name~=^b", "labels.n") == ["A", "b"]
    assert code(names, "size>3") == grpc.StatusCode.INVALID_ARGUMENT


def test_restart_keeps_records_and_removes_crash_leftovers(tmp_path):
    root = tmp_path / "root"
    sock = f"/tmp/bsr-{tmp_path.name[-8:]}.sock"
    s = SnapshotterServer(sock, str(root)).start()
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        stub = snapshots_pb2_grpc.SnapshotsStub(ch)
        prepare(stub, "a")
        commit(stub, "A", "a")
    s.stop(grace=0)
    (root / "snapshots/new-99/fs").mkdir(parents=True)   # a create a crash interrupted
    (root / "snapshots/77").mkdir()                      # a remove a crash interrupted
    (root / "snapshots/not-ours").mkdir()
    s = SnapshotterServer(sock, str(root)).start()
    try:
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            stub = snapshots_pb2_grpc.SnapshotsStub(ch)
            assert stub.Stat(pb.StatSnapshotRequest(key="A")).info.name == "A"
        assert sorted(os.listdir(root / "snapshots")) == ["1", "not-ours"]
    finally:
        s.stop(grace=0)


def test_a_second_server_on_the_same_socket_is_refused(client, tmp_path):
    with pytest.raises(UsageError, match="already serves"):
        SnapshotterServer(client.sock, str(tmp_path / "other"))
    regular = tmp_path / "file.sock"
    regular.write_text("")
    with pytest.raises(UsageError, match="not a socket"):
        SnapshotterServer(str(regular), str(tmp_path / "other"))


@pytest.mark.root
def test_an_active_snapshot_in_use_is_not_removed(client, tmp_path):
    need(is_root(), "mounting the snapshot needs root")
    prepare(client, "a")
    commit(client, "A", "a")
    m = prepare(client, "b", "A")[0]
    target = tmp_path / "mnt"
    target.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", ",".join(m.options),
                    str(target)], check=True)
    try:
        assert code(client.Remove, pb.RemoveSnapshotRequest(key="b")) == \
            grpc.StatusCode.FAILED_PRECONDITION
    finally:
        subprocess.run(["umount", str(target)], check=True)
    client.Remove(pb.RemoveSnapshotRequest(key="b"))


def test_the_cli_works_without_grpc_installed():
    """grpcio is an extra (bootseer[containerd]): without it every other command works and
    the snapshotter says what to install."""
    import sys
    prog = ("import sys; sys.modules['grpc'] = None; from bootseer.cli.main import main; "
            "sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", prog, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "snapshotter" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-c", prog, "snapshotter", "serve", "--address",
                        "/tmp/x.sock"], capture_output=True, text=True)
    assert r.returncode == 1 and "pip install 'bootseer[containerd]'" in r.stderr, r.stderr
