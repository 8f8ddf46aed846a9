"""``bootseer store`` end to end, as a subprocess, on a local store, its nginx view and a
registry."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def bs(*args, input=None, env=None):
    return subprocess.run([sys.executable, "-m", "bootseer", "store", *args], input=input,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=60)


def test_round_trip_local_and_http(tmp_path, nginx_factory):
    store = str(tmp_path / "s")
    data = os.urandom(9 * 1024**2 + 7)  # more than one streamed part
    (tmp_path / "f").write_bytes(data)
    r = bs("--store", store, "put", str(tmp_path / "f"), "--ref", "demo/one")
    assert r.returncode == 0, r.stderr
    digest = r.stdout.decode().strip()
    assert bs("--store", store, "cat", digest).stdout == data
    assert bs("get", digest, "-o", str(tmp_path / "out"),
              env={"BOOTSEER_STORE_URL": store}).returncode == 0
    assert (tmp_path / "out").read_bytes() == data
    assert bs("--store", store, "stat", digest).stdout.decode().split() == [digest, str(len(data))]
    r = bs("--store", store, "put", "-", input=b"from stdin")
    d2 = r.stdout.decode().strip()
    assert sorted(bs("--store", store, "ls").stdout.decode().split()) == sorted([digest, d2])
    assert bs("--store", store, "ref", "set", "demo/two", d2).returncode == 0
    r = bs("--store", store, "ref", "set", "demo/two", digest, "--exclusive")
    assert r.returncode == 3 and b"already exists" in r.stderr
    assert bs("--store", store, "ls", "--refs", "demo/").stdout.decode().split() == [
        "demo/one", digest, "demo/two", d2]
    assert bs("--store", store, "ref", "get", "demo/two").stdout.decode().strip() == d2
    assert bs("--store", store, "ref", "rm", "demo/two").returncode == 0
    r = bs("--store", store, "ref", "get", "demo/two")
    assert r.returncode == 1 and b"bootseer: error: no ref 'demo/two'" in r.stderr

    server = nginx_factory(tmp_path / "s")
    assert bs("--store", server.url, "cat", digest).stdout == data
    assert bs("--store", server.url, "ref", "get", "demo/one").stdout.decode().strip() == digest
    r = bs("--store", server.url, "put", str(tmp_path / "f"))
    assert r.returncode == 1 and b"read-only" in r.stderr


@pytest.mark.slow
def test_errors(tmp_path):
    store = str(tmp_path / "s")
    (tmp_path / "f").write_bytes(b"x")
    assert bs("--store", store, "put", str(tmp_path / "f")).returncode == 0
    r = bs("--store", store, "cat", "sha256:" + "2" * 64)
    assert r.returncode == 1 and b"bootseer: error: blob sha256:2222" in r.stderr
    assert b"not found" in r.stderr
    r = bs("--store", store, "stat", "nope")   # usage: exit 2 (docs/cli.md)
    assert r.returncode == 2 and b"not a sha256 digest" in r.stderr
    r = bs("--store", store, "put", str(tmp_path / "missing"))
    assert r.returncode == 1 and b"cannot read" in r.stderr
    r = bs("--store", store, "ref", "set", "x", "sha256:" + "3" * 64)
    assert r.returncode == 1 and b"no such blob" in r.stderr
    r = bs("--store", store, "ref", "set", "../x", "sha256:" + "3" * 64)
    assert r.returncode == 1 and b"error" in r.stderr
    r = bs("--store", "nosuch://x", "ls")
    assert r.returncode == 2 and b"unknown scheme" in r.stderr


def test_corrupt_blob_is_not_written_out(tmp_path):
    store = tmp_path / "s"
    (tmp_path / "f").write_bytes(b"good bytes")
    digest = bs("--store", str(store), "put", str(tmp_path / "f")).stdout.decode().strip()
    path = store / "blobs/sha256" / digest[7:9] / digest[7:]
    os.chmod(path, 0o644)
    path.write_bytes(b"evil bytes")
    r = bs("--store", str(store), "get", digest, "-o", str(tmp_path / "out"))
    assert r.returncode == 1 and b"corrupt" in r.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.part-*"))


def test_against_a_registry(registry, tmp_path):
    url = f"oci://127.0.0.1:{registry.port}/cli/test"
    (tmp_path / "f").write_bytes(b"in the registry")
    r = bs("--store", url, "put", str(tmp_path / "f"), "--ref", "tagged/one")
    assert r.returncode == 0, r.stderr
    digest = r.stdout.decode().strip()
    assert bs("--store", url, "cat", digest).stdout == b"in the registry"
    assert digest in bs("--store", url, "ls").stdout.decode().split()  # referenced by the ref
    assert bs("--store", url, "ls", "--refs").stdout.decode().split() == ["tagged/one", digest]
