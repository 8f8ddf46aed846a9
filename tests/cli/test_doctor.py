"""``bootseer doctor`` finds what a node lacks: exit 1 and a hint when a required part is
missing, one JSON document with --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.node import tools

NAMES = {"/dev/fuse", "mount permission", "podman", "runc", "container runtime",
         "containerd", "uv", "store", "cache directory", "GPUs / CDI", "kernel: EROFS",
         "kernel: FUSE passthrough", "skopeo", "libfuse3", "grpcio", "protobuf", "libtorrent",
         "user namespaces", "criu"}


def _doc(r):
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1
    return doc, {c["name"]: c for c in doc["checks"]}


def test_doctor_on_a_ready_node(world, need_fuse):
    r = world.run("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split("  ")[0] for line in r.stdout.splitlines()
            if not line.startswith(" ")][:2] == ["/dev/fuse", "mount permission"]
    doc, by = _doc(world.run("doctor", "--json"))
    assert doc["ok"] is True and set(by) == NAMES
    assert by["store"]["ok"] and by["cache directory"]["ok"] and by["uv"]["ok"]


def test_missing_store_fails_without_creating_it(world, tmp_path):
    (tmp_path / "a-file").write_text("x")
    r = world.run("doctor", "--json", env={"BOOTSEER_STORE_URL": str(tmp_path / "a-file/s")})
    assert r.returncode == 1
    doc, by = _doc(r)
    assert doc["ok"] is False and not by["store"]["ok"] and by["store"]["hint"]
    r = world.run("doctor", env={"BOOTSEER_STORE_URL": "ftp://no-such-host.invalid/s"})
    assert r.returncode == 1
    line = next(x for x in r.stdout.splitlines() if x.startswith("store "))
    assert "MISSING" in line and "no-such-host.invalid" in line
    r = world.run("doctor", "--json", env={"BOOTSEER_STORE_URL": str(tmp_path / "later")})
    assert _doc(r)[1]["store"]["ok"] and not (tmp_path / "later").exists()


def test_doctor_finds_no_cap_sys_admin(world, need_fuse):
    r = world.run("doctor", "--json", prefix=["capsh", "--drop=cap_sys_admin", "--", "-c",
                                              'exec "$0" "$@"'])
    assert r.returncode == 1, r.stderr
    check = _doc(r)[1]["mount permission"]
    assert not check["ok"] and "CAP_SYS_ADMIN" in check["hint"]


def test_doctor_finds_no_dev_fuse(world, need_fuse):
    r = world.run("doctor", "--json", prefix=[
        "unshare", "-m", "--propagation", "private", "sh", "-c",
        'mount -t tmpfs none /dev && exec "$0" "$@"'])
    assert r.returncode == 1, r.stderr
    check = _doc(r)[1]["/dev/fuse"]
    assert not check["ok"] and check["detail"] == "missing" and "modprobe fuse" in check["hint"]


def _path_without(tmp_path: Path, hidden: str) -> str:
    """A PATH holding every program of this one but ``hidden``."""
    d = tmp_path / f"bin-without-{hidden}"
    if d.exists():
        return str(d)
    d.mkdir()
    for folder in os.environ.get("PATH", "").split(":"):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            target = os.path.join(folder, name)
            if name != hidden and not (d / name).exists() and os.access(target, os.X_OK):
                (d / name).symlink_to(target)
    return str(d)


@pytest.mark.parametrize("hidden", ["skopeo", "podman", "runc", "containerd", "fusermount3"])
def test_doctor_with_a_program_hidden_says_what_it_costs(world, tmp_path, hidden):
    r = world.run("doctor", "--json", env={"PATH": _path_without(tmp_path, hidden)})
    doc, by = _doc(r)
    check = by[hidden]
    assert not check["ok"] and tools.BY_NAME[hidden].hint in check["hint"]
    assert r.returncode == (1 if hidden == "fusermount3" else 0)
    if hidden == "skopeo":   # the table's last line says it too: no "all ok" without it
        text = world.run("doctor", env={"PATH": _path_without(tmp_path, hidden)}).stdout
        summary = text.strip().splitlines()[-1]
        assert summary.startswith("required: all") and "skopeo" in summary


@pytest.mark.parametrize("module", ["grpc", "google.protobuf", "libtorrent"])
def test_doctor_with_a_module_hidden_gives_the_extras_hint(world, module):
    code = (f"import sys; sys.modules[{module!r}] = None; from bootseer.cli.main import main; "
            "sys.exit(main(['doctor', '--json']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=world.env, timeout=60)
    name = next(n for n, t in tools.BY_NAME.items() if t.probe == module)
    check = _doc(r)[1][name]
    assert not check["ok"] and "pip install 'bootseer[" in check["hint"]


def test_doctor_with_libfuse3_hidden(world, tmp_path, need_root):
    found = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    lib = next(line.split(" => ")[1].strip() for line in found.splitlines()
               if "libfuse3.so.3 " in line)
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    r = world.run("doctor", "--json", prefix=[
        "unshare", "-m", "--propagation", "private", "sh", "-c",
        f'mount --bind {empty} {os.path.realpath(lib)} && exec "$0" "$@"'])
    assert r.returncode == 1
    check = _doc(r)[1]["libfuse3"]
    assert not check["ok"] and check["required"] and "libfuse3-3" in check["hint"]


def test_a_verb_needing_a_missing_tool_gives_doctors_hint(world, tmp_path):
    layout = tmp_path / "app.tar"
    layout.write_bytes(b"not really an archive")
    r = world.run("image", "convert", "registry.example/team/app:1",
                  env={"PATH": _path_without(tmp_path, "skopeo")})
    assert r.returncode == 1
    assert "image convert needs skopeo" in r.stderr
    assert f"bootseer: hint: {tools.BY_NAME['skopeo'].hint}" in r.stderr


def test_a_local_path_that_does_not_exist_is_no_such_file(world, tmp_path):
    r = world.run("image", "convert", str(tmp_path / "nope.tar"))
    assert r.returncode == 1
    lines = [x for x in r.stderr.splitlines() if x.startswith("bootseer: error:")]
    assert lines == [f"bootseer: error: {tmp_path / 'nope.tar'}: no such file or directory"]
    assert "skopeo" not in r.stderr and "invalid reference" not in r.stderr


@pytest.mark.parametrize("version, ok", [(None, False), ("Version: 3.17", False),
                                         ("Version: 4.1", True)])
def test_doctor_says_whether_criu_can_snapshot_warm_processes(world, tmp_path, version, ok):
    """Never required (warm starts fork from a zygote without it); below 4.1 it fails on
    recent kernels, so it is reported as not usable with the version it has."""
    path = _path_without(tmp_path, "criu")
    if version is not None:   # a criu of that version on PATH: only --version is asked
        fake = tmp_path / "criu-bin"
        fake.mkdir()
        (fake / "criu").write_text(f"#!/bin/sh\necho '{version}'\n")
        (fake / "criu").chmod(0o755)
        path = f"{fake}:{path}"
    doc, by = _doc(world.run("doctor", "--json", env={"PATH": path}))
    assert by["criu"]["ok"] is ok and by["criu"]["required"] is False
    assert (by["criu"]["hint"] is None) is ok
    if version:
        assert version.split()[-1] in by["criu"]["detail"]
