"""``bootseer store`` end to end on a local store and its HTTP view."""

import subprocess
import sys


def bs(*args, input=None):
    return subprocess.run([sys.executable, "-m", "bootseer", "store", *args], input=input,
                          capture_output=True)


def test_put_get_stat_ls_ref(tmp_path, nginx_factory):
    store = str(tmp_path / "s")
    (tmp_path / "f").write_bytes(b"hello blob")
    r = bs("--store", store, "put", str(tmp_path / "f"), "--ref", "demo/one")
    assert r.returncode == 0, r.stderr
    digest = r.stdout.decode().strip()
    assert bs("--store", store, "cat", digest).stdout == b"hello blob"
    assert bs("--store", store, "stat", digest).stdout.decode().split() == [digest, "10"]
    assert bs("--store", store, "ls").stdout.decode().split() == [digest]
    assert bs("--store", store, "ls", "--refs").stdout.decode().split() == ["demo/one", digest]
    assert bs("--store", store, "put", "-", input=b"x").returncode == 0
    server = nginx_factory(tmp_path / "s")
    assert bs("--store", server.url, "cat", digest).stdout == b"hello blob"
    assert bs("--store", server.url, "ref", "demo/one").stdout.decode().strip() == digest
    r = bs("--store", server.url, "put", str(tmp_path / "f"))
    assert r.returncode == 1 and b"read-only" in r.stderr
    r = bs("--store", store, "cat", "sha256:" + "2" * 64)
    assert r.returncode == 1 and b"not found" in r.stderr
    r = bs("--store", store, "ref", "missing")
    assert r.returncode == 1 and b"no ref" in r.stderr
