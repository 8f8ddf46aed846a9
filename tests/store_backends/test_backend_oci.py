"""OCI registry backend against the real docker-registry: chunked uploads, manifests and
tags, refs as tags, basic auth (htpasswd) and bearer tokens (a token server of ours in
front of the real registry)."""

from __future__ import annotations

import http.client
import io
import json
import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bootseer.config import BootseerConfig
from bootseer.errors import BlobNotFound, DigestMismatch, StoreError
from bootseer.store import open_store, sha256_digest
from bootseer.store.backends.oci import MANIFEST, OciBackend, ref_to_tag
from tests.conftest import need

pytestmark = pytest.mark.timeout(120)
DATA = os.urandom(100_000)
DIGEST = sha256_digest(DATA)


def test_chunked_upload_of_a_stream(registry):
    b = OciBackend(f"oci://127.0.0.1:{registry.port}/bs/chunks", chunk_bytes=1 << 20)
    big = os.urandom(3 * (1 << 20) + 123)  # 3 PATCH chunks + the last one in the PUT
    d = sha256_digest(big)
    assert b.write(d, io.BytesIO(big)) is True
    assert b.stat(d) == len(big)
    assert b.read(d, (1 << 20) - 5, (1 << 20) + 5) == big[(1 << 20) - 5:(1 << 20) + 5]
    assert b.read(d) == big
    exact = os.urandom(2 << 20)  # a multiple of the chunk size
    assert b.write(sha256_digest(exact), io.BytesIO(exact))
    assert b.read(sha256_digest(exact)) == exact


def test_chunked_stream_with_wrong_bytes_is_cancelled(registry):
    b = OciBackend(f"oci://127.0.0.1:{registry.port}/bs/bad", chunk_bytes=1 << 20)
    wrong = "sha256:" + "ab" * 32
    with pytest.raises(DigestMismatch, match="refusing to store"):
        b.write(wrong, io.BytesIO(os.urandom(2_500_000)))
    assert not b.exists(wrong)


def test_manifests_tags_and_listing(registry):
    b = open_store(f"oci://127.0.0.1:{registry.port}/bs/art")
    b.write(DIGEST, DATA)
    cfg = sha256_digest(b"{}")
    b.write(cfg, b"{}")
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                           "artifactType": "application/vnd.bootseer.test",
                           "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                                      "digest": cfg, "size": 2},
                           "layers": [{"mediaType": "application/octet-stream",
                                       "digest": DIGEST, "size": len(DATA)}]}).encode()
    md = b.put_manifest("v1", manifest, MANIFEST)
    assert md == sha256_digest(manifest)
    body, media, digest = b.get_manifest("v1")
    assert (body, media, digest) == (manifest, MANIFEST, md)
    assert b.get_manifest(md)[0] == manifest
    assert "v1" in b.list_tags()
    assert set(b.list()) == {cfg, DIGEST}
    with pytest.raises(BlobNotFound, match="manifest nope not found"):
        b.get_manifest("nope")


def test_ref_names_that_are_not_tags(registry):
    b = open_store(f"oci://127.0.0.1:{registry.port}/bs/refs")
    b.write(DIGEST, DATA)
    long = "leases/" + "x" * 200
    for name in (long, "a--b/c"):
        assert ref_to_tag(name).startswith("refh.")
        assert b.set_ref(name, DIGEST, exclusive=True)
        assert not b.set_ref(name, DIGEST, exclusive=True)
        assert b.get_ref(name) == DIGEST
    assert ref_to_tag("jobs/a") == "ref.jobs--a"
    assert list(b.list_refs("leases/")) == [long]
    b.delete_ref(long)
    assert b.get_ref(long) is None and b.get_ref("a--b/c") == DIGEST
    with pytest.raises(BlobNotFound):  # a ref must point at a blob that is there
        b.set_ref("dangling", "sha256:" + "1" * 64)


def test_bad_urls_and_https_default():
    with pytest.raises(StoreError, match="expected oci://host:port/repo"):
        open_store("oci://127.0.0.1:5000")
    with pytest.raises(StoreError, match="lower-case"):
        open_store("oci://127.0.0.1:5000/Upper/Case")
    assert OciBackend("oci://registry.example:5000/r").base.startswith("https://")
    assert OciBackend("oci://registry.example:5000/r", insecure=True).base.startswith("http://")
    assert OciBackend("oci://localhost:5000/r").base.startswith("http://")


def _htpasswd(path):
    need(shutil.which("htpasswd") is not None, "htpasswd missing (apt-get install apache2-utils)")
    subprocess.run(["htpasswd", "-Bbc", str(path), "alice", "s3cret-pw"], check=True,
                   capture_output=True)
    return str(path)


def test_basic_auth(registry_factory, tmp_path, monkeypatch):
    reg = registry_factory(htpasswd=_htpasswd(tmp_path / "htpasswd"))
    url = f"oci://127.0.0.1:{reg.port}/p/s"
    monkeypatch.setenv("BOOTSEER_STORE_USERNAME", "alice")
    monkeypatch.setenv("BOOTSEER_STORE_PASSWORD", "s3cret-pw")
    good = open_store(url, BootseerConfig.from_env())
    assert good.write(DIGEST, DATA) and good.read(DIGEST, 0, 3) == DATA[:3]
    assert good.set_ref("r", DIGEST) and good.get_ref("r") == DIGEST
    assert "s3cret" not in repr(good) and "s3cret" not in good.url
    bad = OciBackend(url, username="alice", password="wrong-pw")
    with pytest.raises(StoreError, match="refused access.*check store.username") as e:
        bad.stat(DIGEST)
    assert "wrong-pw" not in str(e.value) and "wrong-pw" not in repr(bad)
    with pytest.raises(StoreError, match="refused access"):
        bad.read(DIGEST)
    anon = OciBackend(url)
    with pytest.raises(StoreError, match="needs credentials"):
        anon.read(DIGEST, 0, 10)


class TokenProxy:
    """A registry front that demands bearer tokens (RFC 6750 challenge) and a token
    endpoint handing them out for basic credentials; forwards to the real registry."""

    TOKEN = "tok-" + os.urandom(8).hex()

    def __init__(self, registry_port: int):
        self.reg = f"127.0.0.1:{registry_port}"
        self.token_calls = 0
        proxy = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _reply(self, status, headers, body=b""):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _handle(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if self.path.startswith("/token"):
                    proxy.token_calls += 1
                    import base64
                    ok = "Basic " + base64.b64encode(b"alice:s3cret-pw").decode()
                    if self.headers.get("Authorization") != ok:
                        return self._reply(401, {})
                    return self._reply(200, {"Content-Type": "application/json"},
                                       json.dumps({"token": proxy.TOKEN}).encode())
                if self.headers.get("Authorization") != f"Bearer {proxy.TOKEN}":
                    chal = (f'Bearer realm="http://127.0.0.1:{proxy.port}/token",'
                            f'service="test",scope="repository:p/s:pull,push"')
                    return self._reply(401, {"WWW-Authenticate": chal})
                conn = http.client.HTTPConnection(proxy.reg, timeout=30)
                fwd = {k: v for k, v in self.headers.items()
                       if k.lower() in ("content-type", "content-range", "range", "accept")}
                conn.request(self.command, self.path, body=body or None, headers=fwd)
                resp = conn.getresponse()
                data = resp.read()
                hdrs = {k: v.replace(proxy.reg, f"127.0.0.1:{proxy.port}")
                        for k, v in resp.getheaders()
                        if k.lower() not in ("content-length", "connection",
                                             "transfer-encoding", "date")}
                conn.close()
                self._reply(resp.status, hdrs, data)

            do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

            def do_HEAD(self):
                conn = http.client.HTTPConnection(proxy.reg, timeout=30)
                if self.headers.get("Authorization") != f"Bearer {proxy.TOKEN}":
                    return self._handle()
                conn.request("HEAD", self.path,
                             headers={"Accept": self.headers.get("Accept", "*/*")})
                resp = conn.getresponse()
                resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "date"):
                        self.send_header(k, v)
                self.end_headers()
                conn.close()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def test_bearer_token_auth(registry):
    with TokenProxy(registry.port) as proxy:
        url = f"oci://127.0.0.1:{proxy.port}/p/s"
        b = OciBackend(url, username="alice", password="s3cret-pw")
        assert b.write(DIGEST, DATA) is True
        assert b.stat(DIGEST) == len(DATA)
        assert b.read(DIGEST, 10, 20) == DATA[10:20]
        assert b.set_ref("jobs/x", DIGEST) and b.get_ref("jobs/x") == DIGEST
        assert proxy.token_calls == 1  # the token is cached
        assert proxy.TOKEN not in repr(b)
        bad = OciBackend(url, username="alice", password="nope")
        with pytest.raises(StoreError, match="token service .* refused the credentials") as e:
            bad.stat(DIGEST)
        assert "nope" not in str(e.value)


def _claim(url, i, barrier, results):
    b = open_store(url)
    d = sha256_digest(f"claim {i}".encode())
    barrier.wait()
    results.put((i, b.set_ref("leases/build", d, exclusive=True)))


def test_exclusive_claim_has_one_winner_across_processes(registry):
    """The registry has no atomic create: several processes that all see the tag absent
    all put it, and the settle-and-read-back makes exactly one of them the winner."""
    import multiprocessing
    url = f"oci://127.0.0.1:{registry.port}/bs/claims"
    b = open_store(url)
    for i in range(4):
        b.write(sha256_digest(f"claim {i}".encode()), f"claim {i}".encode())
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(url, i, barrier, results)) for i in range(4)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(10)
    winners = [i for i, won in got.items() if won]
    assert len(winners) == 1
    assert b.get_ref("leases/build") == sha256_digest(f"claim {winners[0]}".encode())


def _flaky_registry(answers: list[int]):
    """A server answering each HEAD with the next status of ``answers`` (the last repeats),
    as a registry does for a moment while another client's upload of the blob commits."""
    seen: list[str] = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_HEAD(self):
            seen.append(self.command)
            status = answers[min(len(seen), len(answers)) - 1]
            self.send_response(status)
            self.send_header("Content-Length", str(len(DATA) if status == 200 else 0))
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_a_stat_answered_5xx_for_a_moment_is_asked_again():
    server, seen = _flaky_registry([500, 503, 200])
    try:
        b = OciBackend(f"oci://127.0.0.1:{server.server_address[1]}/bs/flaky")
        assert b.stat(DIGEST) == len(DATA)
        assert len(seen) == 3
    finally:
        server.shutdown()


def test_a_registry_that_stays_5xx_fails_the_stat_after_a_few_tries():
    from bootseer.errors import FetchError
    server, seen = _flaky_registry([500])
    try:
        b = OciBackend(f"oci://127.0.0.1:{server.server_address[1]}/bs/flaky")
        with pytest.raises(FetchError, match="HTTP 500"):
            b.stat(DIGEST)
        assert len(seen) == 4
    finally:
        server.shutdown()
