"""Every backend against its real server: a directory, nginx (HTTP), docker-registry
(OCI), and fsspec's memory filesystem (the boundary HDFS/S3 are reached through)."""

from __future__ import annotations

import os
import threading

import pytest

from bootseer.errors import BlobNotFound, DigestMismatch, InvalidDigest, ReadOnlyStore, StoreError
from bootseer.store import open_store, sha256_digest

pytestmark = pytest.mark.timeout(120)
DATA = os.urandom(300_000)
DIGEST = sha256_digest(DATA)
MISSING = "sha256:" + "0" * 64


def check_roundtrip(b):
    assert b.write(DIGEST, DATA) is True
    assert b.write(DIGEST, DATA) is False
    assert b.exists(DIGEST) and b.stat(DIGEST) == len(DATA)
    assert b.read(DIGEST) == DATA
    assert b.read(DIGEST, 1000, 2000) == DATA[1000:2000]
    assert b.read(DIGEST, 299_990) == DATA[299_990:]
    with pytest.raises(BlobNotFound):
        b.read(MISSING)
    with pytest.raises(BlobNotFound):
        b.stat(MISSING)
    with pytest.raises(DigestMismatch):
        b.write(MISSING, b"not these bytes")
    assert not b.exists(MISSING)
    assert b.set_ref("jobs/a/profile", DIGEST, exclusive=True) is True
    assert b.set_ref("jobs/a/profile", DIGEST, exclusive=True) is False
    assert b.get_ref("jobs/a/profile") == DIGEST
    assert "jobs/a/profile" in list(b.list_refs("jobs/"))
    b.delete_ref("jobs/a/profile")
    assert b.get_ref("jobs/a/profile") is None


def test_local(tmp_path):
    b = open_store(str(tmp_path / "store"))
    check_roundtrip(b)
    assert list(b.list()) == [DIGEST]
    assert not [p for p in (tmp_path / "store").rglob(".tmp-*")]
    with pytest.raises(InvalidDigest):
        b.read("md5:abc")
    with pytest.raises(StoreError, match="invalid ref"):
        b.get_ref("../../etc/passwd")


def test_local_exclusive_ref_is_atomic(tmp_path):
    b = open_store(f"file://{tmp_path}/s")
    wins = []
    barrier = threading.Barrier(8)

    def race(i):
        barrier.wait()
        wins.append(b.set_ref("lease", sha256_digest(str(i).encode()), exclusive=True))

    b2 = [b.write(sha256_digest(str(i).encode()), str(i).encode()) for i in range(8)]
    assert all(b2)
    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert wins.count(True) == 1


def test_http_reads_what_nginx_serves(tmp_path, nginx_factory):
    local = open_store(str(tmp_path / "store"))
    local.write(DIGEST, DATA)
    local.set_ref("published/x", DIGEST)
    server = nginx_factory(tmp_path / "store")
    b = open_store(server.url)
    assert b.stat(DIGEST) == len(DATA) and b.read(DIGEST, 5, 10) == DATA[5:10]
    assert b.get_ref("published/x") == DIGEST and b.get_ref("nope") is None
    assert list(b.list()) == [DIGEST]
    assert list(b.list_refs()) == ["published/x"]
    with pytest.raises(BlobNotFound):
        b.read(MISSING)
    with pytest.raises(ReadOnlyStore):
        b.write(DIGEST, DATA)


def test_http_server_down_is_a_fetch_error(tmp_path, nginx_factory):
    from bootseer.errors import FetchError
    server = nginx_factory(tmp_path)
    b = open_store(server.url)
    server.stop()
    with pytest.raises(FetchError):
        b.read(DIGEST)


def test_oci_registry(registry):
    b = open_store(f"oci://127.0.0.1:{registry.port}/bootseer/store")
    check_roundtrip(b)
    big = os.urandom(40 * 1024**2 + 123)  # chunked upload path
    d = sha256_digest(big)
    assert b.write(d, big) and b.read(d, 20 * 1024**2, 20 * 1024**2 + 10) == big[20 * 1024**2:][:10]
    with pytest.raises(StoreError, match="cannot list blobs"):
        list(b.list())


def test_oci_basic_auth(registry_factory, tmp_path):
    import subprocess
    import shutil
    htpasswd = tmp_path / "htpasswd"
    if shutil.which("htpasswd"):
        subprocess.run(["htpasswd", "-Bbc", str(htpasswd), "alice", "s3cret"], check=True,
                       capture_output=True)
    else:
        bcrypt = pytest.importorskip("bcrypt")
        htpasswd.write_text("alice:" + bcrypt.hashpw(b"s3cret", bcrypt.gensalt()).decode() + "\n")
    reg = registry_factory(htpasswd=str(htpasswd))
    from bootseer.store.backends.oci import OciBackend
    good = OciBackend(f"oci://127.0.0.1:{reg.port}/p/s", username="alice", password="s3cret")
    assert good.write(DIGEST, DATA) and good.read(DIGEST, 0, 3) == DATA[:3]
    bad = OciBackend(f"oci://127.0.0.1:{reg.port}/p/s", username="alice", password="wrong")
    with pytest.raises(StoreError, match="refused the credentials") as e:
        bad.stat(DIGEST)
    assert "wrong" not in str(e.value)


def test_fsspec_memory_boundary():
    b = open_store("memory://bootseer-test-store")
    check_roundtrip(b)
    assert DIGEST in list(b.list())


def test_unknown_scheme_is_a_clear_error():
    with pytest.raises(StoreError, match="fsspec driver"):
        open_store("nosuchscheme://x/y")
