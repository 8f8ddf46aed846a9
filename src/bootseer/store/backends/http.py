"""Read-only store over HTTP(S): the local-directory layout served by any web server
(nginx here). Fast path for many nodes reading one published store."""

from __future__ import annotations

import json
import urllib.parse
from typing import Iterator

from bootseer.errors import BlobNotFound, ReadOnlyStore
from bootseer.store import http
from bootseer.store.digest import Digest, hex_of, parse


class HttpBackend:
    writable = False

    def __init__(self, url: str, timeout: float = 30.0):
        self.base = url.rstrip("/")
        self.url = http._safe(self.base)
        self.host = urllib.parse.urlsplit(url).netloc
        self.timeout = timeout

    def _blob_url(self, digest: Digest) -> str:
        h = hex_of(digest)
        return f"{self.base}/blobs/sha256/{h[:2]}/{h}"

    def stat(self, digest: Digest) -> int:
        status, headers, _ = http.request("HEAD", self._blob_url(digest), timeout=self.timeout)
        if status == 404:
            raise BlobNotFound(f"blob {digest} not found at {self.url}", digest=digest,
                               url=self.url)
        if status != 200:
            from bootseer.errors import FetchError
            raise FetchError(f"HEAD of {digest} at {self.url}: HTTP {status}", digest=digest,
                             url=self.url)
        return int(headers["content-length"])

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

    def write(self, digest, data, size=None) -> bool:
        raise ReadOnlyStore(f"{self.url} is a read-only HTTP store: write blobs to the "
                            f"directory it serves", url=self.url, digest=digest)

    def _listing(self, path: str) -> list[dict]:
        status, _, body = http.request("GET", f"{self.base}/{path}", timeout=self.timeout)
        if status != 200:
            return []
        try:
            return json.loads(body)
        except ValueError:
            return []

    def list(self) -> Iterator[Digest]:
        for d in self._listing("blobs/sha256/"):
            if d.get("type") == "directory":
                for f in self._listing(f"blobs/sha256/{d['name']}/"):
                    if f.get("type") == "file":
                        yield "sha256:" + f["name"]

    def get_ref(self, name: str) -> Digest | None:
        status, _, body = http.request("GET", f"{self.base}/refs/{name}", timeout=self.timeout)
        if status == 404:
            return None
        if status != 200:
            from bootseer.errors import FetchError
            raise FetchError(f"ref {name} at {self.url}: HTTP {status}", url=self.url)
        return parse(body.decode().strip())

    def set_ref(self, name, digest, *, exclusive=False) -> bool:
        raise ReadOnlyStore(f"{self.url} is a read-only HTTP store", url=self.url)

    def delete_ref(self, name) -> None:
        raise ReadOnlyStore(f"{self.url} is a read-only HTTP store", url=self.url)

    def list_refs(self, prefix: str = "") -> Iterator[str]:
        def walk(path: str):
            for e in self._listing(f"refs/{path}"):
                if e.get("type") == "directory":
                    yield from walk(f"{path}{e['name']}/")
                else:
                    yield f"{path}{e['name']}"
        return (n for n in walk("") if n.startswith(prefix))

    def close(self) -> None:
        pass
