"""Range sources over remote checkpoint files (RangeSource contract of bootseer.store.source).

A remote file is identified by URL + size + mtime/etag. Every response is checked against
that identity: a file replaced or truncated during a read raises :class:`FileChanged`
(never retried, never mixed with bytes of another version).

* ``http(s)://``: range GETs through the fast keep-alive client of bootseer.store.http;
  the ETag of the first response is remembered and every later response must match it,
  and ``Content-Range``'s total must be the listed size.
* anything else: fsspec ``cat_file`` ranges; size and mtime re-checked after each range.
"""

from __future__ import annotations

import email.utils
import threading
import urllib.parse

from bootseer import redact
from bootseer.ckpt import credentials
from bootseer.errors import BlobNotFound, FetchError, RangeError, StoreError

CANCEL_CHECK_BYTES = 1 << 20  # the most one piece of a cancellable read waits for


class ReadCancelled(StoreError):
    """A read given up by its caller (a hedged read whose twin answered first)."""


class FileChanged(StoreError):
    """The remote file no longer is the version the read started on."""


def http_date(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


class HttpFileSource:
    """One file on an HTTP server (nginx, any server with range support)."""

    def __init__(self, url: str, size: int, mtime: float | None = None,
                 etag: str | None = None, timeout: float = 30.0):
        self.url, self.size, self.mtime, self.etag = url, size, mtime, etag
        self.timeout = timeout
        self.host = urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
        # the identity never holds credentials: it names staging files and profiles
        self.key = f"{redact.strip(url)}|{size}|{mtime}"
        self.headers = credentials.auth_headers(url)
        self.credentialed = redact.has_credentials(url) or bool(self.headers)
        self._lock = threading.Lock()

    @classmethod
    def stat(cls, url: str, timeout: float = 30.0) -> "HttpFileSource":
        """Identity from a HEAD request (for files opened without a listing)."""
        from bootseer.store.http import request
        status, h, _ = request("HEAD", url, timeout=timeout, headers=credentials.auth_headers(url))
        if status == 404:
            raise BlobNotFound(f"{url} not found (404)", url=url)
        if status != 200:
            raise FetchError(f"HEAD {url} returned HTTP {status}", url=url)
        return cls(url, int(h.get("content-length", 0)), http_date(h.get("last-modified")),
                   h.get("etag"), timeout)

    def read_range(self, start: int, end: int, cancel: threading.Event | None = None
                   ) -> bytes:
        """Bytes ``[start, end)``. With ``cancel``, the body is read in pieces and the
        connection dropped as soon as the event is set (a hedged read's loser stops using
        the link): ReadCancelled."""
        from bootseer.store.http import send
        if end <= start:
            return b""
        with send("GET", self.url, timeout=self.timeout,
                  headers={**self.headers, "Range": f"bytes={start}-{end - 1}"}) as r:
            status, h = r.status, r.headers
            if status == 404:
                raise FileChanged(f"{self.url} disappeared (404) after it was listed; "
                                  "was the checkpoint deleted or moved?", url=self.url,
                                  offset=start)
            if status == 416:
                raise FileChanged(f"{self.url} is shorter than its listed size {self.size} "
                                  f"(range {start}-{end} refused): truncated or replaced",
                                  url=self.url, offset=start)
            if status >= 500:
                raise FetchError(f"GET {self.url} bytes {start}-{end} returned HTTP {status}",
                                 url=self.url, offset=start)
            if status not in (200, 206):
                raise StoreError(f"GET {self.url} bytes {start}-{end} returned HTTP {status}",
                                 url=self.url, offset=start)
            self._check(h, start)
            body = r.read() if cancel is None else self._read_unless(r, cancel, start)
        if status == 200:
            body = body[start:end]
        if len(body) != end - start:
            raise FileChanged(f"{self.url}: got {len(body)} bytes at offset {start}, expected "
                              f"{end - start}; the file is truncated (listed size "
                              f"{self.size})", url=self.url, offset=start)
        return body

    def _read_unless(self, r, cancel: threading.Event, start: int) -> bytes:
        parts = []
        while True:
            if cancel.is_set():
                r.abort()
                raise ReadCancelled(f"{self.url} bytes from {start}: cancelled (another "
                                    "replica answered first)", url=self.url, offset=start)
            piece = r.read_some(CANCEL_CHECK_BYTES)
            if not piece:
                return b"".join(parts)
            parts.append(piece)

    def _check(self, h: dict, start: int) -> None:
        total = h.get("content-range", "").rpartition("/")[2]
        if total.isdigit() and int(total) != self.size:
            raise FileChanged(f"{self.url} is now {total} bytes, was {self.size} when opened: "
                              "it was replaced during the read", url=self.url, offset=start)
        mtime = http_date(h.get("last-modified"))
        if self.mtime is not None and mtime is not None and abs(mtime - self.mtime) >= 1:
            raise FileChanged(f"{self.url} was modified during the read (Last-Modified "
                              f"{h.get('last-modified')})", url=self.url, offset=start)
        etag = h.get("etag")
        if etag:
            with self._lock:
                if self.etag is None:
                    self.etag = etag
                elif etag != self.etag:
                    raise FileChanged(f"{self.url} changed during the read (ETag {self.etag} "
                                      f"-> {etag})", url=self.url, offset=start)

    def __repr__(self) -> str:
        return f"HttpFileSource({redact.url(self.url)})"


class FsspecFileSource:
    """One file of an fsspec filesystem (``file://``, ``s3://``, ``hdfs://``, ``memory://``)."""

    def __init__(self, fs, path: str, size: int, mtime=None, url: str | None = None):
        self.fs, self.path, self.size, self.mtime = fs, path, size, mtime
        self.url = url or path
        proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.host = f"{proto}:{getattr(fs, 'host', '') or ''}"
        self.key = f"{redact.strip(self.url)}|{size}|{mtime}"
        self.credentialed = redact.has_credentials(self.url)

    @staticmethod
    def stamp(info: dict):
        return (info.get("mtime") or info.get("LastModified") or info.get("ETag")
                or info.get("modificationTime") or info.get("created"))

    @classmethod
    def stat(cls, url: str) -> "FsspecFileSource":
        import fsspec
        fs, path = fsspec.core.url_to_fs(url)
        try:
            info = fs.info(path)
        except FileNotFoundError as e:
            raise BlobNotFound(f"{url} not found", url=url) from e
        return cls(fs, path, int(info["size"]), cls.stamp(info), url)

    def read_range(self, start: int, end: int, cancel: threading.Event | None = None
                   ) -> bytes:
        """Bytes ``[start, end)`` (``cancel`` is not checked: fsspec's cat_file cannot be
        interrupted, so a hedged loser runs to its end)."""
        if end <= start:
            return b""
        try:
            data = self.fs.cat_file(self.path, start, end)
            info = self.fs.info(self.path)
        except FileNotFoundError as e:
            raise FileChanged(f"{self.url} disappeared after it was listed", url=self.url,
                              offset=start) from e
        except StoreError:
            raise
        except (OSError, ConnectionError, TimeoutError) as e:
            raise FetchError(f"reading {self.url} bytes {start}-{end} failed: {e}",
                             url=self.url, offset=start) from e
        if int(info["size"]) != self.size or self.stamp(info) != self.mtime:
            raise FileChanged(f"{self.url} changed during the read (size {self.size} -> "
                              f"{info['size']}, mtime {self.mtime} -> {self.stamp(info)})",
                              url=self.url, offset=start)
        if len(data) != end - start:
            raise FileChanged(f"{self.url}: got {len(data)} bytes at offset {start}, expected "
                              f"{end - start}: truncated", url=self.url, offset=start)
        return data

    def __repr__(self) -> str:
        return f"FsspecFileSource({redact.url(self.url)})"


def open_source(url: str):
    """A RangeSource for one file URL (a HEAD / info call)."""
    if url.startswith(("http://", "https://")):
        return HttpFileSource.stat(url)
    if "://" not in url:
        url = "file://" + str(__import__("os").path.abspath(url))
    return FsspecFileSource.stat(url)


__all__ = ["FileChanged", "ReadCancelled", "HttpFileSource", "FsspecFileSource", "open_source",
           "RangeError"]
