"""The HTTP client and read-only HTTP backend against real nginx: status codes, the
200-with-full-body fallback, corrupted bytes, a server killed mid-read, the pool."""

from __future__ import annotations

import os
import threading

import pytest

from bootseer.errors import (
    BlobNotFound,
    DigestMismatch,
    FetchError,
    RangeError,
    ReadOnlyStore,
    StoreError,
)
from bootseer.store import http, open_store, sha256_digest
from bootseer.store.digest import verify

pytestmark = pytest.mark.timeout(60)
DATA = os.urandom(1_000_000)
DIGEST = sha256_digest(DATA)


@pytest.fixture
def served(tmp_path, nginx_factory):
    local = open_store(str(tmp_path / "store"))
    local.write(DIGEST, DATA)
    root = (tmp_path / "store").resolve()
    server = nginx_factory(tmp_path / "store", extra_locations=(
        "location /err500/ { return 500; }\n"
        "location /err503/ { return 503; }\n"
        f"location /norange/ {{ alias {root}/; max_ranges 0; }}\n"
        "location /redir/ { rewrite ^/redir/(.*)$ /$1 redirect; }\n"
        "location /denied/ { return 403; }"))
    return local, server


def test_status_codes_map_to_errors(served):
    local, server = served
    r = open_store(server.url)
    with pytest.raises(BlobNotFound, match="not found") as e:
        r.read("sha256:" + "1" * 64, 0, 10)
    assert e.value.url == server.url
    with pytest.raises(RangeError, match="416") as e:
        r.read(DIGEST, len(DATA) + 5)
    assert e.value.offset == len(DATA) + 5 and e.value.digest == DIGEST
    for code in ("500", "503"):
        bad = open_store(f"{server.url}/err{code}")
        with pytest.raises(FetchError, match=f"HTTP {code}") as e:
            bad.read(DIGEST, 0, 100)
        assert e.value.digest == DIGEST and f"err{code}" in e.value.url
        with pytest.raises(FetchError, match=f"HTTP {code}"):
            bad.stat(DIGEST)
    with pytest.raises(StoreError, match="403, access denied") as e:
        open_store(f"{server.url}/denied").read(DIGEST, 0, 10)
    assert not isinstance(e.value, FetchError)  # not retried by the fetcher


def test_server_ignoring_range_answers_200_and_is_sliced(served):
    _, server = served
    r = open_store(f"{server.url}/norange")
    assert r.read(DIGEST, 500_000, 500_010) == DATA[500_000:500_010]
    assert r.read(DIGEST, 10, 20) == DATA[10:20]  # connection after a dropped body is fine
    buf = bytearray(1000)
    assert r.read_into(DIGEST, 999_000, buf) == 1000 and bytes(buf) == DATA[999_000:]


def test_read_into_a_preallocated_buffer(served):
    _, server = served
    r = open_store(server.url)
    buf = bytearray(len(DATA))
    view = memoryview(buf)
    assert r.read_into(DIGEST, 0, view[:400_000]) == 400_000
    assert r.read_into(DIGEST, 400_000, view[400_000:]) == 600_000
    assert bytes(buf) == DATA
    with pytest.raises(FetchError, match="ended after"):
        r.read_into(DIGEST, 999_990, bytearray(100))  # only 10 bytes there


def test_corrupted_file_served_is_detected_by_verify(served, tmp_path):
    local, server = served
    path = local.path(DIGEST)
    os.chmod(path, 0o644)
    path.write_bytes(bytes([DATA[0] ^ 0xFF]) + DATA[1:])  # a real change, whatever DATA[0] is
    r = open_store(server.url)
    data = r.read(DIGEST)
    with pytest.raises(DigestMismatch, match="corrupt") as e:
        verify(DIGEST, data, source=r.url)
    assert e.value.digest == DIGEST and e.value.url == server.url


def test_server_down(tmp_path, nginx_factory):
    server = nginx_factory(tmp_path, own=True)   # stopped below
    r = open_store(server.url)
    server.stop()
    with pytest.raises(FetchError, match="refused|reachable") as e:
        r.read(DIGEST, 0, 10)
    assert e.value.digest == DIGEST and server.url in str(e.value)


def test_server_killed_mid_read_names_url_and_digest(tmp_path, nginx_factory):
    big = os.urandom(8_000_000)
    d = sha256_digest(big)
    open_store(str(tmp_path / "s")).write(d, big)
    server = nginx_factory(tmp_path / "s", limit_rate="500k")
    from bootseer.store.backends.http import HttpBackend
    r = HttpBackend(server.url, timeout=5)
    killer = threading.Timer(0.4, server.kill)
    killer.start()
    try:
        with pytest.raises(FetchError) as e:
            r.read(d)
    finally:
        killer.join()
    msg = str(e.value)
    assert d in msg and server.url in msg and e.value.digest == d


def test_pool_reuses_connections_across_threads(served):
    _, server = served
    http.POOL.clear()
    r = open_store(server.url)
    errors = []

    def worker(i):
        try:
            for k in range(20):
                s = (i * 20 + k) * 1000
                assert r.read(DIGEST, s, s + 1000) == DATA[s:s + 1000]
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    idle = sum(len(v) for v in http.POOL._idle.values())
    assert 1 <= idle <= 8  # at most one connection per thread was ever opened


def test_credentials_never_in_errors(served):
    _, server = served
    url = server.url.replace("http://", "http://bob:hunter2@") + "/err500"
    r = open_store(url)
    assert "hunter2" not in r.url and "hunter2" not in repr(r)
    with pytest.raises(FetchError) as e:
        r.read(DIGEST, 0, 1)
    assert "hunter2" not in str(e.value) and "hunter2" not in (e.value.url or "")


def test_listing_needs_json_autoindex(tmp_path, nginx_factory):
    open_store(str(tmp_path / "s")).write(DIGEST, DATA)
    server = nginx_factory(tmp_path / "s", autoindex=False)
    r = open_store(server.url)
    assert r.read(DIGEST, 0, 5) == DATA[:5]
    with pytest.raises(StoreError):
        list(r.list())


def test_read_only(served):
    _, server = served
    r = open_store(server.url)
    with pytest.raises(ReadOnlyStore, match="read-only"):
        r.write(DIGEST, DATA)
    with pytest.raises(ReadOnlyStore):
        r.set_ref("x", DIGEST)
    with pytest.raises(ReadOnlyStore):
        r.delete_ref("x")


def test_stale_pooled_connections_reconnect(tmp_path, nginx_factory):
    open_store(str(tmp_path / "s")).write(DIGEST, DATA)
    server = nginx_factory(tmp_path / "s", own=True)   # stopped and restarted below
    r = open_store(server.url)
    results = []
    threads = [threading.Thread(target=lambda: results.append(r.read(DIGEST, 0, 100)))
               for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    server.stop()  # every pooled keep-alive connection is now dead
    nginx_factory(tmp_path / "s", port=server.port)
    assert r.read(DIGEST, 100, 200) == DATA[100:200]
    assert r.stat(DIGEST) == len(DATA)


def test_redirects_are_followed(served):
    _, server = served
    r = open_store(f"{server.url}/redir")
    assert r.read(DIGEST, 100, 200) == DATA[100:200]
    assert r.read_into(DIGEST, 0, bytearray(10)) == 10


def test_https_verifies_the_server_certificate(tmp_path, nginx_factory, monkeypatch):
    import shutil
    import subprocess

    from tests.conftest import need
    need(shutil.which("openssl") is not None, "openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    open_store(str(tmp_path / "s")).write(DIGEST, DATA)
    server = nginx_factory(tmp_path / "s", tls=(str(cert), str(key)))
    url = f"https://127.0.0.1:{server.port}"
    with pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
        open_store(url).read(DIGEST, 0, 10)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trust our CA, as a site would
    r = open_store(url)
    assert r.host == f"127.0.0.1:{server.port}"
    assert r.read(DIGEST, 10, 20) == DATA[10:20] and r.stat(DIGEST) == len(DATA)
    assert DIGEST in set(r.list())


def test_forked_child_does_not_share_pooled_connections(tmp_path, nginx_factory):
    """The FUSE server is a forked child: it must open its own connections, or parent and
    child read each other's responses on one keep-alive socket."""
    import multiprocessing

    from bootseer.store import http as H
    (tmp_path / "a").write_bytes(b"A" * 100_000)
    (tmp_path / "b").write_bytes(b"B" * 100_000)
    server = nginx_factory(tmp_path)
    assert H.get_range(f"{server.url}/a", 0, 10) == b"A" * 10   # leaves a pooled connection
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child():
        ok = all(H.get_range(f"{server.url}/b", 0, 100_000) == b"B" * 100_000 for _ in range(50))
        q.put(ok)
    p = ctx.Process(target=child)
    p.start()
    parent_ok = all(H.get_range(f"{server.url}/a", 0, 100_000) == b"A" * 100_000 for _ in range(50))
    p.join(60)
    assert parent_ok and q.get(timeout=5)
