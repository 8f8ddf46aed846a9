"""A small, fast, thread-safe HTTP/1.1 client on :mod:`http.client`.

Every network read of bootseer (store blobs, checkpoint stripes) goes through
:func:`get_range` / :func:`get_range_into`. Measured on this kind of machine, http.client
on kept-alive connections moves ~2 GiB/s on loopback where httpx managed a few hundred
MiB/s, so this module stays on the standard library:

* a keep-alive connection pool per (scheme, host, port), shared by all threads (a thread
  takes an idle connection or opens one, and gives it back when the body is read);
* range GETs that accept 206 and 200-with-the-full-body (the body is skipped up to the
  range and the connection dropped rather than drained when the rest is large);
* ``readinto`` a caller's preallocated buffer (:func:`get_range_into`);
* errors: 404 -> BlobNotFound, 416 -> RangeError, 5xx / refused / reset / timeout ->
  FetchError. Every error carries the URL without credentials or query string;
* proxies as every HTTP client on the node takes them: ``HTTP_PROXY`` / ``HTTPS_PROXY``
  (``user:password@`` becomes Proxy-Authorization; https through a CONNECT tunnel) and
  ``NO_PROXY``; without ``NO_PROXY``, loopback is never proxied.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import os
import re
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import IO

from bootseer.errors import (
    BlobNotFound,
    ConfigError,
    FetchError,
    RangeError,
    StoreError,
    WrongRange,
)

_REDIRECTS = (301, 302, 303, 307, 308)
_SKIP_CHUNK = 1 << 20
_DRAIN_MAX = 1 << 20
"""A response remainder larger than this (bytes) is not drained: the connection is
dropped instead (cheaper than reading what nobody wants)."""
_MAX_IDLE = 64
"""Idle connections kept per (scheme, host, port)."""


class Pool:
    """Idle keep-alive connections per (scheme, host, port); thread-safe."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def take(self, key: tuple[str, str, int], timeout: float
             ) -> tuple[http.client.HTTPConnection, bool]:
        """A connection for ``key`` and whether it was reused (a reused one may have been
        closed by the server meanwhile: callers retry once on a fresh one)."""
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                conn = idle.pop()
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                return conn, True
        scheme, host, port = key
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        proxy = proxy_for(scheme, host)
        if proxy is None:
            return cls(host, port, timeout=timeout), False
        if proxy.hostname is None:   # "http://:8080" and the like: nowhere to connect to
            raise ConfigError("HTTPS_PROXY" if scheme == "https" else "HTTP_PROXY",
                              f"the proxy for {scheme}:// names no host")
        auth = _proxy_auth(proxy)
        if scheme == "https":   # a tunnel: TLS runs end to end, the proxy sees bytes only
            conn = cls(proxy.hostname, proxy.port or 80, timeout=timeout)
            conn.set_tunnel(host, port, headers=auth)
        else:                   # absolute-form requests to the proxy
            conn = http.client.HTTPConnection(proxy.hostname, proxy.port or 80, timeout=timeout)
            conn.bootseer_proxy_headers = auth   # type: ignore[attr-defined]
        return conn, False

    def give(self, key: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < _MAX_IDLE:
                idle.append(conn)
                return
        conn.close()

    def drop(self, key: tuple[str, str, int]) -> None:
        """Close every idle connection to ``key`` (after one turned out stale, the others
        from the same period are likely stale too)."""
        with self._lock:
            conns = self._idle.pop(key, [])
        for c in conns:
            c.close()

    def clear(self) -> None:
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for c in conns:
            c.close()


POOL = Pool()


def _forget_after_fork() -> None:
    """A forked child (the FUSE server of a mount) must not reuse its parent's idle
    sockets: two processes on one keep-alive connection read each other's responses.
    The child forgets them without closing (closing would not affect the parent, but
    TLS shutdown could)."""
    POOL._idle = {}
    POOL._lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def proxy_for(scheme: str, host: str) -> urllib.parse.SplitResult | None:
    """The proxy a request to ``scheme://host`` goes through, from the environment
    (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``, any case), or None."""
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme)
    if not url:
        return None
    if "no" in proxies:
        # documented nowhere and missing from typeshed, but the one stdlib reading of
        # NO_PROXY that does not consult the OS (proxy_bypass would, on macOS and Windows)
        if urllib.request.proxy_bypass_environment(  # type: ignore[attr-defined]
                host, proxies):
            return None
    elif _loopback(host):
        return None
    return urllib.parse.urlsplit(url if "://" in url else "http://" + url)


def _proxy_auth(proxy: urllib.parse.SplitResult) -> dict[str, str]:
    if proxy.username is None:
        return {}
    cred = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password or '')}"
    return {"Proxy-Authorization": "Basic " + base64.b64encode(cred.encode()).decode()}


def safe_url(url: str) -> str:
    """``url`` without user, password or query string (safe to log and to put in errors)."""
    u = urllib.parse.urlsplit(url)
    netloc = u.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if u.port:
        netloc += f":{u.port}"
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path, "", ""))


_safe = safe_url  # older name, kept for callers


def _split(url: str) -> tuple[tuple[str, str, int], str, dict[str, str]]:
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise FetchError(f"not an http(s) URL: {safe_url(url)!r}", url=safe_url(url))
    port = u.port or (443 if u.scheme == "https" else 80)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    extra: dict[str, str] = {}
    if u.username is not None:  # user:password@host -> basic auth, never logged
        cred = f"{urllib.parse.unquote(u.username)}:{urllib.parse.unquote(u.password or '')}"
        extra["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
    return (u.scheme, u.hostname, port), path, extra


class Response:
    """An open response whose body has not been read yet; ``close()`` returns the
    connection to the pool (or drops it if the body was not fully read)."""

    def __init__(self, key: tuple[str, str, int], conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse, url: str):
        self._key, self.raw, self.url = key, resp, url
        self._conn: http.client.HTTPConnection | None = conn
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}

    @property
    def length(self) -> int | None:
        return self.raw.length

    def read(self, n: int | None = None) -> bytes:
        return self._body(self.raw.read) if n is None else self._body(self.raw.read, n)

    def read_some(self, n: int) -> bytes:
        """Up to ``n`` bytes of the body, whatever one read from the socket gives (b"" at
        its end): for readers that check something between pieces."""
        return self._body(self.raw.read1, n)

    def _body(self, how: Callable[..., bytes], *args: int) -> bytes:
        try:
            return how(*args)
        except (http.client.HTTPException, OSError) as e:
            self._fail()
            raise FetchError(f"reading the body of {safe_url(self.url)} failed: "
                             f"{type(e).__name__}: {e}", url=safe_url(self.url)) from e

    def readinto(self, buf: memoryview) -> int:
        """Fill ``buf`` completely from the body; FetchError if the body ends early."""
        got = 0
        try:
            while got < len(buf):
                n = self.raw.readinto(buf[got:])
                if not n:
                    break
                got += n
        except (http.client.HTTPException, OSError) as e:
            self._fail()
            raise FetchError(f"reading the body of {safe_url(self.url)} failed after {got} "
                             f"bytes: {type(e).__name__}: {e}", url=safe_url(self.url)) from e
        if got < len(buf):
            self._fail()
            raise FetchError(f"{safe_url(self.url)}: the body ended after {got} of {len(buf)} "
                             f"bytes (server closed the connection)", url=safe_url(self.url))
        return got

    def skip(self, n: int) -> None:
        while n > 0:
            chunk = self.read(min(n, _SKIP_CHUNK))
            if not chunk:
                self._fail()
                raise FetchError(f"{safe_url(self.url)}: the body ended early",
                                 url=safe_url(self.url))
            n -= len(chunk)

    def abort(self) -> None:
        """Drop the connection with the body unread (the reader gave up on it)."""
        self._fail()

    def _fail(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        left = self.raw.length
        reusable = (not self.raw.will_close and left is not None and left <= _DRAIN_MAX)
        if reusable:
            try:  # also reads an empty body, which marks the response complete
                self.raw.read()
            except (http.client.HTTPException, OSError):
                reusable = False
        if reusable and self.raw.isclosed():
            POOL.give(self._key, conn)
        else:
            conn.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def send(method: str, url: str, *, headers: Mapping[str, str] | None = None,
         body: bytes | IO[bytes] | None = None, timeout: float = 30.0) -> Response:
    """Send one request on a pooled connection; the body is left unread (use the returned
    :class:`Response` as a context manager). Reconnects once when a reused keep-alive
    connection turns out to be closed. Transport failures raise FetchError."""
    key, path, extra = _split(url)
    hdrs = {**extra, **(headers or {})}
    for _ in range(2):
        conn, reused = POOL.take(key, timeout)
        try:
            rewind = getattr(body, "seek", None)   # a file body was read by the failed try
            if rewind is not None and reused:
                rewind(0)
            via = getattr(conn, "bootseer_proxy_headers", None)
            if via is not None:   # a plain-http proxy takes the whole URL as the target
                target = urllib.parse.urlunsplit((key[0], f"{key[1]}:{key[2]}", "", "", ""))
                conn.request(method, target + path, body=body, headers={**hdrs, **via})
            else:
                conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
        except (http.client.HTTPException, OSError) as e:
            conn.close()
            stale = reused and isinstance(e, (http.client.RemoteDisconnected,
                                              ConnectionResetError, BrokenPipeError))
            if stale:
                POOL.drop(key)
                continue
            raise FetchError(f"{method} {safe_url(url)} failed: {type(e).__name__}: {e} "
                             f"(is the server up and reachable?)", url=safe_url(url)) from e
        return Response(key, conn, resp, url)
    raise AssertionError("unreachable")


def request(method: str, url: str, *, headers: Mapping[str, str] | None = None,
            body: bytes | IO[bytes] | None = None, timeout: float = 30.0
            ) -> tuple[int, dict[str, str], bytes]:
    """One request; returns (status, lower-cased headers, whole body)."""
    with send(method, url, headers=headers, body=body, timeout=timeout) as r:
        data = b"" if method == "HEAD" else r.read()
        return r.status, r.headers, data


def _range_header(start: int, end: int | None) -> str:
    return f"bytes={start}-" + ("" if end is None else str(end - 1))


def open_range(url: str, start: int, end: int | None, *, timeout: float = 30.0,
               headers: Mapping[str, str] | None = None, follow_redirects: bool = True
               ) -> tuple[Response, int]:
    """Send a range GET (following redirects; Authorization is dropped when a redirect
    leaves the host, as for registries that redirect to signed object-store URLs).
    Returns the response and how many body bytes must be skipped (non-zero when the server
    ignored Range and answered 200 with the whole body: streamed past, never buffered).
    Error statuses are returned, not raised, so callers can handle 401 first; a 206 for
    another range than the one asked raises WrongRange."""
    hdrs = dict(headers or {})
    if start or end is not None:
        hdrs["Range"] = _range_header(start, end)
    for _ in range(6):
        r = send("GET", url, headers=hdrs, timeout=timeout)
        if follow_redirects and r.status in _REDIRECTS and "location" in r.headers:
            nxt = urllib.parse.urljoin(url, r.headers["location"])
            r.close()
            if urllib.parse.urlsplit(nxt).netloc != urllib.parse.urlsplit(url).netloc:
                hdrs.pop("Authorization", None)
            url = nxt
            continue
        if r.status == 206:
            try:
                check_content_range(r.headers.get("content-range"), start, end, None,
                                    safe_url(url))
            except WrongRange:
                r.close()
                raise
        return r, (start if r.status == 200 else 0)
    raise FetchError(f"GET {safe_url(url)}: too many redirects", url=safe_url(url))


def raise_for_status(status: int, url: str, start: int, end: int | None,
                     digest: str | None) -> None:
    """Map an HTTP error status of a range GET to the store's exceptions."""
    if status in (200, 206):
        return
    s = safe_url(url)
    what = f"blob {digest} at {s}" if digest else s
    if status == 404:
        raise BlobNotFound(f"{what} not found (HTTP 404)", url=s, digest=digest)
    if status == 416:
        raise RangeError(f"range [{start}, {end}) is outside {what} (HTTP 416): check the "
                         f"offset against the blob size", url=s, offset=start, digest=digest)
    if status in (401, 403):  # not transient: a StoreError the fetcher does not retry
        raise StoreError(f"GET {what}: HTTP {status}, access denied (check the credentials "
                         f"in the store URL)", url=s, digest=digest)
    raise FetchError(f"GET {what} returned HTTP {status}", url=s, digest=digest, offset=start)


def read_body(r: Response, skip: int, start: int, end: int | None, *,
              digest: str | None = None) -> bytes:
    """The requested range from a 200/206 response (closes it)."""
    with r:
        if skip:
            r.skip(skip)
        if end is None:
            return r.read()
        want = end - start
        data = r.read(want)
        if len(data) < want and (r.status == 206 or r.length):
            # a 206 for less than asked is fine only at the end of the blob
            total = _total_size(r.headers)
            if total is None or start + len(data) < min(end, total):
                raise FetchError(f"{safe_url(r.url)}: short body, {len(data)} of {want} bytes"
                                 + (f" of blob {digest}" if digest else ""),
                                 url=safe_url(r.url), digest=digest, offset=start)
        return data


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.I)


def check_content_range(value: str | None, start: int, end: int | None, size: int | None,
                        url: str) -> None:
    """A ``206``'s ``Content-Range`` must name exactly ``[start, end)`` (and ``size`` as the
    total when it is known; a range past the end of a blob of unknown size may be cut at
    its end): anything else is another part of the file, or of another file, and its
    body must never be taken for the bytes asked for."""
    m = _CONTENT_RANGE.match(value or "")
    ok = False
    if m is not None:
        first, last = int(m.group(1)), int(m.group(2))
        total = None if m.group(3) == "*" else int(m.group(3))
        to_end = total is not None and last == total - 1
        ok = (first == start and last >= first and (size is None or total in (None, size))
              and (to_end if end is None else
                   last == end - 1 or (size is None and to_end and last < end - 1)))
    if not ok:
        asked = f"{start}-" + ("" if end is None else str(end - 1))
        raise WrongRange(f"{url}: asked for bytes {asked}, the server answered 206 "
                         f"with Content-Range {value!r}: its body is refused (a server or "
                         "proxy answering another range)", url=url, offset=start)


def _total_size(headers: Mapping[str, str]) -> int | None:
    cr = headers.get("content-range", "")
    if "/" in cr and not cr.endswith("/*"):
        return int(cr.rsplit("/", 1)[1])
    return None


def get_range(url: str, start: int = 0, end: int | None = None, *, timeout: float = 30.0,
              headers: Mapping[str, str] | None = None, digest: str | None = None) -> bytes:
    """Bytes ``[start, end)`` of ``url`` (``end=None``: to the end)."""
    if end is not None and end <= start:
        return b""
    r, skip = open_range(url, start, end, timeout=timeout, headers=headers)
    if r.status not in (200, 206):
        r.close()
        raise_for_status(r.status, url, start, end, digest)
    return read_body(r, skip, start, end, digest=digest)


def get_range_into(url: str, start: int, buf: memoryview | bytearray, *,
                   timeout: float = 30.0, headers: Mapping[str, str] | None = None,
                   digest: str | None = None) -> int:
    """Read exactly ``len(buf)`` bytes from ``start`` into ``buf`` (no intermediate copy).
    FetchError if the server has fewer."""
    buf = memoryview(buf).cast("B")
    if not len(buf):
        return 0
    end = start + len(buf)
    r, skip = open_range(url, start, end, timeout=timeout, headers=headers)
    with r:
        if r.status not in (200, 206):
            raise_for_status(r.status, url, start, end, digest)
        if skip:
            r.skip(skip)
        return r.readinto(buf)
