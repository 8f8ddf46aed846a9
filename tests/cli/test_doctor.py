"""``bootseer doctor`` finds what a node lacks: exit 1 and a hint when a required part is
missing, one JSON document with --json."""

from __future__ import annotations

import json

NAMES = {"/dev/fuse", "mount permission", "podman", "runc", "container runtime",
         "containerd", "uv", "store", "cache directory", "GPUs / CDI", "kernel: EROFS",
         "kernel: FUSE passthrough"}


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
