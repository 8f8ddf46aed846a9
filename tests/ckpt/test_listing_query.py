"""A checkpoint directory URL with a query string (a presigned or tokened URL): the
listing and every file keep the query after their path, and a server's redirect to the
directory with its trailing slash is followed (same host only)."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse

import pytest

from bootseer.ckpt.listing import RemoteDir
from bootseer.errors import FetchError

FILES = {"a.bin": b"A" * 1000, "b.bin": b"B" * 10}


class _Server:
    def __init__(self, *, token="t0k", redirect_to=None):
        self.seen: list[str] = []
        srv = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def answer(self, status, body=b"", headers=()):
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                srv.seen.append(self.path)
                u = urllib.parse.urlsplit(self.path)
                if urllib.parse.parse_qs(u.query).get("token") != [token]:
                    return self.answer(403)
                if redirect_to and u.path == "/old/":
                    return self.answer(301, headers=[("Location", redirect_to)])
                if u.path == "/ckpt/":
                    items = [{"name": n, "type": "file", "size": len(b),
                              "mtime": "Sat, 28 Nov 2026 10:00:00 GMT"} for n, b in FILES.items()]
                    return self.answer(200, json.dumps(items).encode(),
                                       [("Content-Type", "application/json")])
                name = u.path.removeprefix("/ckpt/")
                if name in FILES:
                    return self.answer(200, FILES[name],
                                       [("Last-Modified", "Sat, 28 Nov 2026 10:00:00 GMT")])
                self.answer(404)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def test_the_query_follows_every_path(server):
    d = RemoteDir(f"http://127.0.0.1:{server.port}/ckpt?token=t0k")
    assert sorted(d.names("/")) == ["a.bin", "b.bin"]
    assert d.attr("/a.bin").size == 1000
    assert d.url_of("a.bin") == f"http://127.0.0.1:{server.port}/ckpt/a.bin?token=t0k"
    assert d.source("a.bin").read_range(0, 10) == b"A" * 10
    assert "/ckpt/?token=t0k" in server.seen
    assert not any("token=t0k/" in p for p in server.seen)


def test_a_redirect_to_the_folder_is_followed_on_the_same_host():
    s = _Server(redirect_to="/ckpt/?token=t0k")
    try:
        d = RemoteDir(f"http://127.0.0.1:{s.port}/old?token=t0k")
        assert sorted(d.names("/")) == ["a.bin", "b.bin"]
    finally:
        s.close()


def test_a_redirect_to_another_host_is_refused_in_one_line():
    s = _Server(redirect_to="http://127.0.0.2:9/ckpt/")
    try:
        d = RemoteDir(f"http://127.0.0.1:{s.port}/old?token=t0k")
        with pytest.raises(FetchError, match="redirects to another host"):
            d.names("/")
    finally:
        s.close()
