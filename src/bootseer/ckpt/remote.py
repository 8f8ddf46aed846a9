"""A remote checkpoint directory: its file list (with size and version) and one range
source per file. ``http(s)://`` goes through bootseer's fast HTTP client (listing: nginx
JSON autoindex, which hides dotfiles, so DCP's ``.metadata`` is probed by name); every
other scheme (``hdfs://``, ``webhdfs://``, ``s3://``, ``file://``) through fsspec."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

from bootseer.errors import BlobNotFound, FetchError, StoreError
from bootseer.store import http

WELL_KNOWN_HIDDEN = (".metadata",)


class FileChanged(StoreError):
    """The remote file changed while being read: never mix two versions."""


@dataclass(frozen=True)
class RemoteFile:
    url: str
    path: str          # relative to the checkpoint root, "/a/b"
    size: int
    version: str       # ETag / mtime: part of the cache key
    host: str

    @property
    def key(self) -> str:
        return f"{self.url}|{self.size}|{self.version}"

    def read_range(self, start: int, end: int) -> bytes:
        if self.url.startswith(("http://", "https://")):
            status, h, body = http.request(
                "GET", self.url, headers={"Range": f"bytes={start}-{end - 1}",
                                          "If-Match": self.version} if self.version else
                {"Range": f"bytes={start}-{end - 1}"})
            if status == 412 or (status == 206 and _total(h) not in (None, self.size)):
                raise FileChanged(f"{self.url} changed while it was being read (size or ETag "
                                  f"differs from when it was opened); reopen the checkpoint",
                                  url=self.url, offset=start)
            if status == 206:
                return body
            if status == 200:
                return body[start:end]
            if status == 404:
                raise BlobNotFound(f"{self.url} is gone (404)", url=self.url)
            raise FetchError(f"GET {self.url} bytes {start}-{end}: HTTP {status}", url=self.url)
        import fsspec
        fs, p = fsspec.core.url_to_fs(self.url)
        try:
            info = fs.info(p)
        except FileNotFoundError:
            raise BlobNotFound(f"{self.url} is gone", url=self.url) from None
        if int(info.get("size", -1)) != self.size or _version(info) != self.version:
            raise FileChanged(f"{self.url} changed while it was being read; reopen it",
                              url=self.url, offset=start)
        try:
            return bytes(fs.cat_file(p, start=start, end=end))
        except OSError as e:
            raise FetchError(f"reading {self.url}: {e}", url=self.url, offset=start) from e


def _total(h: dict) -> int | None:
    cr = h.get("content-range", "")
    try:
        return int(cr.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return None


def _version(info: dict) -> str:
    for k in ("ETag", "etag", "mtime", "LastModified", "last_modified", "modification_time"):
        if info.get(k) is not None:
            return str(info[k])
    return ""


def _http_files(url: str, rel: str = "") -> list[tuple[str, str]]:
    status, _, body = http.request("GET", url + rel)
    if status == 404:
        raise BlobNotFound(f"no checkpoint directory at {url + rel}", url=url)
    if status != 200:
        raise FetchError(f"listing {url + rel}: HTTP {status}", url=url)
    try:
        entries = json.loads(body)
    except ValueError as e:
        raise FetchError(f"{url + rel} has no JSON directory listing (nginx: autoindex on; "
                         f"autoindex_format json)", url=url) from e
    out = []
    for e in entries:
        if e["type"] == "directory":
            out += _http_files(url, f"{rel}{e['name']}/")
        else:
            out.append((url + rel + e["name"], "/" + rel + e["name"]))
    return out


def _http_head(url: str) -> tuple[int, str] | None:
    status, h, _ = http.request("HEAD", url)
    if status != 200:
        return None
    return int(h.get("content-length", 0)), h.get("etag", "")


def list_files(url: str) -> dict[str, RemoteFile]:
    """Every file under ``url`` (a directory, or a single file)."""
    if url.startswith(("http://", "https://")):
        host = url.split("/")[2]
        if not url.endswith("/"):
            head = _http_head(url)
            if head is None:
                raise BlobNotFound(f"no checkpoint at {url}", url=url)
            return {"/" + posixpath.basename(url): RemoteFile(url, "/" + posixpath.basename(url),
                                                              head[0], head[1], host)}
        files = _http_files(url)
        names = {p for _, p in files}
        for hidden in WELL_KNOWN_HIDDEN:
            if "/" + hidden not in names:
                files.append((url + hidden, "/" + hidden))
        out = {}
        for u, p in files:
            head = _http_head(u)
            if head is not None:
                out[p] = RemoteFile(u, p, head[0], head[1], host)
        return out
    import fsspec
    fs, root = fsspec.core.url_to_fs(url)
    proto = url.split("://", 1)[0] if "://" in url else "file"
    try:
        if not fs.isdir(root):
            info = fs.info(root)
            name = "/" + posixpath.basename(root)
            return {name: RemoteFile(url, name, int(info["size"]), _version(info), proto)}
        infos = fs.find(root, detail=True)
    except FileNotFoundError:
        raise BlobNotFound(f"no checkpoint at {url}", url=url) from None
    out = {}
    for p, info in infos.items():
        rel = "/" + posixpath.relpath(p, root.rstrip("/") or "/")
        full = f"{proto}://{p}" if proto != "file" else p
        out[rel] = RemoteFile(full, rel, int(info["size"]), _version(info), proto)
    return out
