"""Read-only store over HTTP(S): the local-directory layout served by any web server
(nginx here), the fast path for many nodes reading one published store.

Reads are range GETs on pooled keep-alive connections (:mod:`bootseer.store.http`).
``list()`` and ``list_refs()`` read nginx's JSON autoindex (``autoindex on;
autoindex_format json;``); other servers can serve blobs but not listings.
Credentials in the URL (``http://user:pw@host/store``) become basic auth and never
appear in ``url``, errors or logs.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from typing import Any, BinaryIO

from bootseer.errors import BlobNotFound, FetchError, ReadOnlyStore, StoreError
from bootseer.store import http
from bootseer.store.backend import head_size
from bootseer.store.backends import check_ref_name
from bootseer.store.digest import Digest, hex_of, parse


class HttpBackend:
    writable = False

    def __init__(self, url: str, timeout: float = 30.0):
        """``url``: base URL of the served store directory; ``timeout``: socket timeout
        of one request, seconds."""
        self.base = url.rstrip("/")
        self.url = http.safe_url(self.base)
        u = urllib.parse.urlsplit(url)
        self.host = f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"HttpBackend({self.url!r})"

    def _blob_url(self, digest: Digest) -> str:
        h = hex_of(digest)
        return f"{self.base}/blobs/sha256/{h[:2]}/{h}"

    def _fail(self, e: FetchError, what: str, digest: Digest | None = None) -> FetchError:
        return FetchError(f"{what} at {self.url} failed: {e}", digest=digest, url=e.url or self.url,
                          offset=e.offset)

    def stat(self, digest: Digest) -> int:
        try:
            status, headers, _ = http.request("HEAD", self._blob_url(digest),
                                              timeout=self.timeout)
        except FetchError as e:
            raise self._fail(e, f"stat of blob {digest}", digest) from e
        return head_size(status, headers, digest, self.url)

    def exists(self, digest: Digest) -> bool:
        try:
            self.stat(digest)
            return True
        except BlobNotFound:
            return False

    def read(self, digest: Digest, start: int = 0, end: int | None = None) -> bytes:
        try:
            return http.get_range(self._blob_url(digest), start, end, timeout=self.timeout,
                                  digest=digest)
        except BlobNotFound:
            raise BlobNotFound(f"blob {digest} not found at {self.url}", digest=digest,
                               url=self.url) from None
        except FetchError as e:
            if e.digest:
                raise
            raise FetchError(f"reading blob {digest} [{start}, {end}): {e}", digest=digest,
                             url=e.url or self.url, offset=start) from e

    def read_into(self, digest: Digest, start: int, buf: memoryview | bytearray) -> int:
        """Fill ``buf`` (a writable buffer) with the blob's bytes from ``start``."""
        try:
            return http.get_range_into(self._blob_url(digest), start, buf,
                                       timeout=self.timeout, digest=digest)
        except FetchError as e:
            if e.digest:
                raise
            raise FetchError(f"reading blob {digest} at {start}: {e}", digest=digest,
                             url=e.url or self.url, offset=start) from e

    def write(self, digest: Digest, data: bytes | BinaryIO, size: int | None = None) -> bool:
        raise ReadOnlyStore(f"{self.url} is a read-only HTTP store: write blobs to the "
                            f"directory it serves (or use an oci:// or fsspec store)",
                            url=self.url, digest=digest)

    def _listing(self, path: str) -> list[dict[str, Any]]:
        """nginx's JSON autoindex of ``path``: entries with name, type, mtime, size."""
        status, headers, body = http.request("GET", f"{self.base}/{path}", timeout=self.timeout)
        if status == 404:
            return []
        if status != 200:
            raise FetchError(f"listing {path} of {self.url}: HTTP {status}", url=self.url)
        try:
            entries = json.loads(body)
            if not isinstance(entries, list):
                raise ValueError("not a list")
        except ValueError:
            raise StoreError(f"{self.url}/{path} is not a JSON directory listing: serve the "
                             f"store with nginx 'autoindex on; autoindex_format json;'",
                             url=self.url) from None
        return entries

    def list(self) -> Iterator[Digest]:
        for d in self._listing("blobs/sha256/"):
            if d.get("type") == "directory":
                for f in self._listing(f"blobs/sha256/{d['name']}/"):
                    if f.get("type") == "file" and not f["name"].startswith("."):
                        yield "sha256:" + f["name"]

    def get_ref(self, name: str) -> Digest | None:
        check_ref_name(name, url=self.url)
        status, _, body = http.request("GET", f"{self.base}/refs/{name}", timeout=self.timeout)
        if status == 404:
            return None
        if status != 200:
            raise FetchError(f"ref {name} at {self.url}: HTTP {status}", url=self.url)
        return parse(body.decode(errors="replace").strip())

    def set_ref(self, name: str, digest: Digest, *, exclusive: bool = False) -> bool:
        raise ReadOnlyStore(f"{self.url} is a read-only HTTP store: set refs in the directory "
                            f"it serves", url=self.url)

    def delete_ref(self, name: str) -> None:
        raise ReadOnlyStore(f"{self.url} is a read-only HTTP store: delete refs in the "
                            f"directory it serves", url=self.url)

    def list_refs(self, prefix: str = "") -> Iterator[str]:
        def walk(path: str) -> Iterator[str]:
            for e in self._listing(f"refs/{path}"):
                if e.get("name", "").startswith("."):
                    continue
                if e.get("type") == "directory":
                    yield from walk(f"{path}{e['name']}/")
                else:
                    yield f"{path}{e['name']}"
        return (n for n in sorted(walk("")) if n.startswith(prefix))

    def close(self) -> None:
        pass
