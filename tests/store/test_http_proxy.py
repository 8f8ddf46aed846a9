"""The HTTP client takes proxies as every client on the node does: HTTP_PROXY/HTTPS_PROXY,
NO_PROXY; loopback is never proxied unless NO_PROXY says otherwise."""

from __future__ import annotations

import http.server
import threading
import urllib.request

import pytest

from bootseer.store import http as client

DATA = b"0123456789" * 100


class _Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(DATA)))
        self.end_headers()
        self.wfile.write(DATA)

    def log_message(self, *a):
        pass


class _Proxy(http.server.BaseHTTPRequestHandler):
    """A forward proxy for absolute-form requests: records what it forwards."""
    protocol_version = "HTTP/1.1"
    seen: list = []

    def do_GET(self):
        type(self).seen.append((self.path, self.headers.get("Proxy-Authorization")))
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(self.path) as r:
            body = r.read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _serve(handler):
    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


@pytest.fixture
def servers():
    origin, proxy = _serve(_Origin), _serve(_Proxy)
    _Proxy.seen = []
    client.POOL.clear()
    yield origin.server_address[1], proxy.server_address[1]
    client.POOL.clear()
    for s in (origin, proxy):
        s.shutdown()
        s.server_close()


def _clear_env(monkeypatch):
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(k, raising=False)
        monkeypatch.delenv(k.lower(), raising=False)


def test_http_goes_through_the_proxy_with_its_credentials(servers, monkeypatch):
    origin, proxy = servers
    _clear_env(monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", f"http://me:pw@127.0.0.1:{proxy}")
    monkeypatch.setenv("NO_PROXY", "registry.internal")
    url = f"http://127.0.0.1:{origin}/blob"
    assert client.get_range(url, 10, 20) == DATA[10:20]
    ((path, auth),) = _Proxy.seen
    assert path == url and auth == "Basic bWU6cHc="


def test_no_proxy_and_loopback_go_direct(servers, monkeypatch):
    origin, proxy = servers
    _clear_env(monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy}")
    assert client.get_range(f"http://127.0.0.1:{origin}/blob", 0, 5) == DATA[:5]   # loopback
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    client.POOL.clear()
    assert client.get_range(f"http://127.0.0.1:{origin}/blob", 0, 5) == DATA[:5]
    assert _Proxy.seen == []


def test_proxy_selection(monkeypatch):
    _clear_env(monkeypatch)
    assert client.proxy_for("https", "s3.example") is None
    monkeypatch.setenv("HTTPS_PROXY", "proxy.corp:3128")
    p = client.proxy_for("https", "s3.example")
    assert (p.hostname, p.port) == ("proxy.corp", 3128)
    assert client.proxy_for("http", "s3.example") is None
    monkeypatch.setenv("NO_PROXY", ".example")
    assert client.proxy_for("https", "s3.example") is None
