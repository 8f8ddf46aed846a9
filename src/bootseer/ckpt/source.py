"""Range sources over remote checkpoint files (RangeSource contract of bootseer.store.source).

A remote file is identified by URL + size + mtime/etag. Every response is checked against
that identity: a file replaced or truncated during a read raises :class:`FileChanged`
(never retried, never mixed with bytes of another version).

* ``http(s)://``: range GETs through the fast keep-alive client of bootseer.store.http;
  the ETag of the first response is remembered and every later response must match it,
  and a ``206``'s ``Content-Range`` must be exactly the range asked for, of the listed
  size: a proxy that answers another range never has its body taken for the one asked.
  A server that ignores ``Range`` (``200`` with the whole body) is detected at its first
  such answer; from then on that file is read as one streamed GET that moves forward
  through the file, so memory and traffic stay at one pass, never a body per stripe.
* anything else: fsspec ``cat_file`` ranges; size and mtime re-checked after each range.
"""

from __future__ import annotations

import email.utils
import logging
import threading
import urllib.parse
from typing import Protocol

from bootseer import redact
from bootseer.ckpt import credentials
from bootseer.config import BootseerConfig
from bootseer.errors import BlobNotFound, FetchError, RangeError, StoreError
from bootseer.store.http import Response, check_content_range

CANCEL_CHECK_BYTES = 1 << 20  # the most one piece of a cancellable read waits for

log = logging.getLogger(__name__)


class FileSource(Protocol):
    """One checkpoint file, read by ranges: an ``HttpFileSource``, an ``FsspecFileSource``
    or ``ckpt.replicas.Replicas`` over several copies of it."""
    url: str
    size: int
    key: str
    """Identity of the bytes (url+size+mtime): it names the staging copy."""
    host: str

    def read_range(self, start: int, end: int) -> bytes: ...


def fetch_timeout_s() -> float:
    """The one request timeout (``BOOTSEER_FETCH_TIMEOUT_S``), as for the store's reads."""
    return BootseerConfig.from_env().fetch.timeout_s


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
                 etag: str | None = None, timeout: float | None = None):
        self.url, self.size, self.mtime, self.etag = url, size, mtime, etag
        self.timeout = fetch_timeout_s() if timeout is None else timeout
        self.host = urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
        # the identity never holds credentials: it names staging files and profiles
        self.key = f"{redact.strip(url)}|{size}|{mtime}"
        self.headers = credentials.auth_headers(url)
        self.credentialed = redact.has_credentials(url) or bool(self.headers)
        self._lock = threading.Lock()
        # set once the server answered a sub-range with the whole body (Range ignored)
        self.ranges_ignored = False
        # that file's one forward-moving GET: (response, pos)
        self._stream: tuple[Response, int] | None = None
        self._stream_lock = threading.Lock()
        self._turn = threading.Condition()   # streamed reads go lowest offset first
        self._waiting: list[int] = []
        self._streaming = False

    @classmethod
    def stat(cls, url: str, timeout: float | None = None) -> HttpFileSource:
        """Identity from a HEAD request (for files opened without a listing)."""
        from bootseer.store.http import request
        timeout = fetch_timeout_s() if timeout is None else timeout
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
        if end <= start:
            return b""
        if self.ranges_ignored:
            return self._read_streamed(start, end, cancel)
        r = self._get(start, end)
        if r.status == 200 and (start > 0 or end < self.size):
            self._ranges_ignored_by(r, start, end)
            return self._read_streamed(start, end, cancel)
        with r:
            # one byte more than asked: a longer body is refused, not read to its end
            body = (r.read(end - start + 1) if cancel is None
                    else self._read_n(r, cancel, start, end + 1))
        return self._exact(body, start, end)

    def _get(self, start: int, end: int | None) -> Response:
        """A GET from ``start`` (to ``end``, or to the end of the file), status and
        identity checked; the caller reads and closes the response."""
        from bootseer.store.http import send
        want = f"bytes={start}-" + ("" if end is None else str(end - 1))
        r = send("GET", self.url, timeout=self.timeout, headers={**self.headers, "Range": want})
        try:
            self._check_status(r.status, start, end if end is not None else self.size)
            self._check(r.headers, start)
            if r.status == 206:
                check_content_range(r.headers.get("content-range"), start,
                                    end if end is not None else self.size, self.size,
                                    redact.url(self.url))
        except BaseException:
            r.close()
            raise
        return r

    def _check_status(self, status: int, start: int, end: int) -> None:
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

    def _exact(self, body: bytes, start: int, end: int) -> bytes:
        if len(body) != end - start:
            raise FileChanged(f"{self.url}: got {len(body)} bytes at offset {start}, expected "
                              f"{end - start}; the file is truncated (listed size "
                              f"{self.size})", url=self.url, offset=start)
        return body

    def _ranges_ignored_by(self, r, start: int, end: int) -> None:
        """The server sent the whole file for a sub-range: this response becomes the
        file's stream (positioned at 0), said once."""
        with self._stream_lock:
            if not self.ranges_ignored:
                self.ranges_ignored = True
                log.warning("%s: the server ignores Range (HTTP 200 for bytes %d-%d): this "
                            "file is read as one sequential stream", redact.url(self.url),
                            start, end - 1)
            if self._stream is None:
                self._stream = (r, 0)
                return
        r.abort()

    def _read_streamed(self, start: int, end: int, cancel: threading.Event | None) -> bytes:
        """``[start, end)`` from the file's one forward-moving GET. Reads waiting for it
        are served lowest offset first (stripes issued together are read in one pass); a
        read behind the stream's position starts a new GET from that offset (a server
        that ignores Range sends from 0 again). Memory: the bytes asked for, never a
        whole body."""
        with self._turn:
            self._waiting.append(start)
            try:
                while self._streaming or start != min(self._waiting):
                    if cancel is not None and cancel.is_set():
                        raise ReadCancelled(f"{self.url} bytes from {start}: cancelled "
                                            "(another replica answered first)",
                                            url=self.url, offset=start)
                    self._turn.wait(0.1)
                self._streaming = True
            finally:
                self._waiting.remove(start)
        try:
            return self._stream_read(start, end, cancel)
        finally:
            with self._turn:
                self._streaming = False
                self._turn.notify_all()

    def _stream_read(self, start: int, end: int, cancel: threading.Event | None) -> bytes:
        with self._stream_lock:
            r, pos = self._stream if self._stream is not None else (None, 0)
            self._stream = None
        if r is None or start < pos:
            if r is not None:
                r.abort()
            r = self._get(start, None)
            pos = start if r.status == 206 else 0
        try:
            if start > pos:
                r.skip(start - pos)
            body = (r.read(end - start) if cancel is None
                    else self._read_n(r, cancel, start, end))
        except BaseException:
            r.abort()
            raise
        with self._stream_lock:
            self._stream = (r, start + len(body))
        return self._exact(body, start, end)

    def _read_n(self, r, cancel: threading.Event, start: int, end: int) -> bytes:
        parts, got = [], 0
        while got < end - start:
            if cancel.is_set():
                r.abort()   # hang up: the twin's answer is in, this link is wanted elsewhere
                raise ReadCancelled(f"{self.url} bytes from {start}: cancelled (another "
                                    "replica answered first)", url=self.url, offset=start)
            piece = r.read_some(min(CANCEL_CHECK_BYTES, end - start - got))
            if not piece:
                break
            parts.append(piece)
            got += len(piece)
        return b"".join(parts)

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
    def stat(cls, url: str) -> FsspecFileSource:
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


__all__ = ["FileChanged", "ReadCancelled", "FileSource", "HttpFileSource", "FsspecFileSource",
           "open_source", "RangeError"]
