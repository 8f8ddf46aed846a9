"""A small HTTP server that misbehaves on purpose, for every reader of remote bytes.

One file (``/f``) and a store layout (``/blobs/sha256/..``) are served; ``mode`` picks the
fault, and can be changed while the server runs:

- ``ok``: a correct range server;
- ``wrong_start``: a 206 whose body and ``Content-Range`` start at 0 whatever was asked;
- ``ignore_range``: 200 with the whole body for every range request;
- ``short`` / ``long``: a 206 with one byte fewer / more than asked (header truthful
  about the range asked, body not);
- ``etag_flip``: every response a new ETag;
- ``slow``: each response held for ``delay_s``;
- ``cut``: the body stops halfway (the connection closed);
- ``burst_5xx``: the next ``failures`` requests answer 503, then ``ok``.

``script`` (a list of modes) is taken one per GET before ``mode`` applies (property tests
interleave faults with it). It counts requests and body bytes sent, so a test can bound
traffic. Bound in time: it serves until ``close()``, on a loopback port the OS picks.
"""

from __future__ import annotations

import http.server
import re
import threading
import time

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class HostileServer:
    def __init__(self, data: bytes, mode: str = "ok", *, delay_s: float = 0.5,
                 failures: int = 3, files: dict[str, bytes] | None = None,
                 script: list[str] | None = None):
        self.data, self.mode, self.delay_s, self.failures = data, mode, delay_s, failures
        self.script = list(script or [])
        self.files = {"/f": data, **(files or {})}
        self.requests = 0
        self.bytes_sent = 0
        self._etag = 0
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                body = server.files.get(self.path.split("?")[0])
                if body is None:
                    return self._send(404, b"", {})
                self._send(200, b"", {"Content-Length": str(len(body)), **server.etag()},
                           length=len(body))

            def do_GET(self):
                server.count()
                body = server.files.get(self.path.split("?")[0])
                if body is None:
                    return self._send(404, b"", {})
                mode = server.take_mode()
                if mode == "burst_5xx":
                    return self._send(503, b"busy", {})
                if mode == "slow":
                    time.sleep(server.delay_s)
                m = _RANGE.match(self.headers.get("Range", ""))
                if m is None or mode == "ignore_range":
                    return self._send(200, body, server.etag())
                start = int(m.group(1))
                end = min(int(m.group(2)) + 1 if m.group(2) else len(body), len(body))
                if start >= len(body):
                    return self._send(416, b"", {"Content-Range": f"bytes */{len(body)}"})
                part = body[start:end]
                shown = (start, end)
                if mode == "wrong_start":
                    part, shown = body[:end - start], (0, end - start)
                elif mode == "short":
                    part = part[:-1]
                elif mode == "long":
                    part = body[start:end + 1]
                headers = {"Content-Range": f"bytes {shown[0]}-{shown[1] - 1}/{len(body)}",
                           **server.etag()}
                if mode == "cut":
                    return self._send(206, part, headers, cut=True)
                self._send(206, part, headers)

            def _send(self, status, body, headers, *, cut=False, length=None):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body) if length is None
                                                           else length))
                self.end_headers()
                if cut:
                    body = body[:len(body) // 2]
                    self.close_connection = True
                with server._lock:
                    server.bytes_sent += len(body)
                try:
                    self.wfile.write(body)
                except OSError:   # the reader dropped the connection (it read what it asked)
                    self.close_connection = True

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass   # a reader that drops a connection mid-body is part of the game

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def count(self) -> None:
        with self._lock:
            self.requests += 1

    def take_mode(self) -> str:
        with self._lock:
            if self.script:
                return self.script.pop(0)
            if self.mode == "burst_5xx":
                if self.failures <= 0:
                    return "ok"
                self.failures -= 1
            return self.mode

    def etag(self) -> dict:
        with self._lock:
            if self.mode == "etag_flip":
                self._etag += 1
            return {"ETag": f'"v{self._etag}"'}

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
