"""A remote checkpoint directory: its entries (size, mtime) and one range source per file.

Listings of ``http(s)://`` directories come from nginx's JSON autoindex (one request: sizes
and times in it), from an HTML index page (nginx's default autoindex, Apache's,
``python -m http.server``: the page's links, then a HEAD per file for its size and time), or,
from a server that lists nothing (403/404 on the directory), from the checkpoint's own
metadata: DCP's ``.metadata`` or ``model.safetensors.index.json`` name the data files
(ckpt/named_files.py). Any other fsspec URL (``hdfs://``, ``webhdfs://``, ``s3://``,
``file://``, ``memory://``) is listed with ``fs.ls``. Each directory is listed once, when
first needed, and its entries are the identity every later read is checked against.
nginx's autoindex hides dot files, so DCP's ``.metadata`` is probed by name.
"""

from __future__ import annotations

import html.parser
import json
import logging
import os
import posixpath
import stat
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from bootseer import redact
from bootseer.ckpt import credentials, named_files
from bootseer.ckpt.replicas import ReplicaMismatch, check_same
from bootseer.ckpt.source import FileSource, FsspecFileSource, HttpFileSource, http_date
from bootseer.errors import BlobNotFound, BootseerError, FetchError, StoreError, UsageError
from bootseer.mount.view import Attr
from bootseer.store.replicas import Replicas

log = logging.getLogger(__name__)

DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444
HIDDEN_PROBED = (".metadata",)  # dot files checkpoints rely on (torch DCP)


class PathOutsideRoot(BootseerError, PermissionError):
    """A path that would leave the checkpoint directory."""


def clean(path: str) -> str:
    """'/a/b' -> 'a/b'; refuses anything that would leave the root."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts or any("\\" in p or "\0" in p for p in parts):
        raise PathOutsideRoot(f"path {path!r} leaves the mounted root")
    return "/".join(parts)


def normalize_url(url: str) -> str:
    """A local path becomes ``file://``; no trailing slash."""
    if "://" not in url:
        url = "file://" + os.path.abspath(url)
    return url.rstrip("/") if not url.endswith("://") else url


_REDIRECTS = (301, 302, 303, 307, 308)


def _get_following(url: str) -> tuple[int, dict, bytes, str]:
    """GET ``url``, following a few redirects within the same host (a server that adds
    the directory's trailing slash answers 301); credentials never follow to another
    host. Returns the last answer and the URL that gave it."""
    from bootseer.store.http import request
    for _ in range(5):
        status, headers, body = request("GET", url, headers=credentials.auth_headers(url))
        nxt = headers.get("location")
        if status not in _REDIRECTS or not nxt:
            return status, headers, body, url
        nxt = urllib.parse.urljoin(url, nxt)
        if urllib.parse.urlsplit(nxt).netloc != urllib.parse.urlsplit(url).netloc:
            raise FetchError(f"{redact.url(url)} redirects to another host "
                             f"({redact.url(nxt)}): give that URL instead", url=url)
        url = nxt
    raise FetchError(f"{redact.url(url)}: too many redirects", url=url)


class RemoteDir:
    """Lazy, cached listing of one checkpoint directory; ``mirrors``: base URLs of
    exact copies (http(s) only), read as replicas of every file."""

    def __init__(self, url: str, *, mirrors: tuple[str, ...] | list[str] = ()):
        self.url = normalize_url(url)
        self.http = self.url.startswith(("http://", "https://"))
        # a presigned or tokened URL: paths join the path, the query follows every one
        parts = urllib.parse.urlsplit(self.url)
        self._base = (urllib.parse.urlunsplit(parts._replace(query="", fragment="")).rstrip("/")
                      if self.http else self.url)
        self._query = parts.query if self.http else ""
        if mirrors and not self.http:
            raise UsageError("mirrors are supported for http(s) checkpoints, not "
                             f"{redact.url(self.url)}")
        for m in mirrors:
            if not m.startswith(("http://", "https://")):
                raise UsageError(f"mirror {redact.url(m)!r} is not an http(s) URL")
        self.mirrors = [RemoteDir(m) for m in mirrors]
        if not self.http:
            import fsspec
            self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self._dirs: dict[str, dict[str, Attr | None]] = {}
        self._lock = threading.Lock()

    def url_of(self, rel: str, *, folder: bool = False) -> str:
        """The URL of ``rel`` under the root (``folder``: with the trailing slash a
        directory listing is asked with), the root's query string kept after the path."""
        url = self._base + ("/" + urllib.parse.quote(rel) if rel else "")
        if folder:
            url += "/"
        return url + ("?" + self._query if self._query else "")

    # -- entries ------------------------------------------------------------------------------
    def check_root(self) -> None:
        """Fail now, clearly, when the root is missing or not a directory, or a mirror
        holds a different file under the same name. A mirror that cannot be listed is
        dropped (logged): the primary serves."""
        if not self.http:
            if not self.fs.isdir(self.root):
                raise BlobNotFound(f"no checkpoint directory at {self.url}", url=self.url)
            return
        entries = self._list("")
        for m in list(self.mirrors):
            try:
                theirs = m._list("")
            except (FetchError, OSError) as e:
                log.warning("mirror %s is not reachable, reading without it: %s",
                            redact.url(m.url), redact.text(str(e)))
                self.mirrors.remove(m)
                continue
            for name, a in entries.items():
                b = theirs.get(name)
                if a is None or a.is_dir:
                    continue
                if b is None:
                    raise ReplicaMismatch(f"mirror {m.url} has no {name}, which {self.url} "
                                          "has: refusing the mirror", url=m.url)
                check_same(self.url_of(name), a.size, a.mtime, m.url_of(name), b.size, b.mtime)

    def attr(self, path: str) -> Attr:
        rel = clean(path)
        if not rel:
            self.check_root()
            return Attr(mode=DIR_MODE, size=0, mtime=time.time(), nlink=2)
        parent, _, name = rel.rpartition("/")
        entries = self._list(parent)
        with self._lock:
            known = name in entries
            a = entries.get(name)
        if not known and self.http and name.startswith("."):
            a = self._probe(rel)
            with self._lock:
                entries[name] = a  # negative entries too: one probe per name
        if a is None:
            raise FileNotFoundError(path)
        return a

    def names(self, path: str) -> list[str]:
        rel = clean(path)
        if self.http:  # show DCP's hidden .metadata too when it is there
            for hidden in HIDDEN_PROBED:
                try:
                    self.attr(f"{rel}/{hidden}")
                except FileNotFoundError:
                    pass
        entries = self._list(rel)
        with self._lock:
            return [n for n, a in entries.items() if a is not None]

    def source(self, path: str) -> FileSource | Replicas:
        """The range source of one file, checked against its listed size and mtime."""
        rel = clean(path)
        a = self.attr(rel)
        if a.is_dir:
            raise IsADirectoryError(path)
        if self.http:
            primary = HttpFileSource(self.url_of(rel), a.size, a.mtime or None)
            replicas = [primary]
            for m in self.mirrors:
                try:
                    b = m.attr(rel)
                except FileNotFoundError:
                    raise ReplicaMismatch(f"mirror {m.url} has no {rel}, which {self.url} "
                                          "has: refusing the mirror", url=m.url) from None
                except FetchError as e:  # a dead mirror: the others serve
                    log.warning("mirror %s is not reachable for %s: %s", redact.url(m.url), rel,
                                redact.text(str(e)))
                    continue
                check_same(primary.url, a.size, a.mtime, m.url_of(rel), b.size, b.mtime)
                replicas.append(HttpFileSource(m.url_of(rel), b.size, b.mtime or None))
            return Replicas(replicas) if len(replicas) > 1 else primary
        full = posixpath.join(self.root, rel)
        info = self.fs.info(full)
        return FsspecFileSource(self.fs, full, a.size, FsspecFileSource.stamp(info),
                                url=self.url_of(rel))

    def walk(self) -> dict[str, FileSource | Replicas]:
        """Every file under the root (relative path -> source), listed recursively."""
        out: dict[str, FileSource | Replicas] = {}
        todo = [""]
        while todo:
            rel = todo.pop()
            for name in self.names(rel):
                child = f"{rel}/{name}" if rel else name
                if self.attr(child).is_dir:
                    todo.append(child)
                else:
                    out[child] = self.source(child)
        return dict(sorted(out.items()))

    # -- listing backends ---------------------------------------------------------------------
    def _list(self, rel: str) -> dict[str, Attr | None]:
        with self._lock:
            hit = self._dirs.get(rel)
        if hit is not None:
            return hit
        entries = self._list_http(rel) if self.http else self._list_fsspec(rel)
        with self._lock:
            return self._dirs.setdefault(rel, entries)

    def _list_http(self, rel: str) -> dict[str, Attr | None]:
        url = self.url_of(rel, folder=True)
        status, headers, body, url = _get_following(url)
        if status in (403, 404):   # no listing: the checkpoint's metadata may name its files
            named = self._list_named(rel)
            if named is not None:
                return named
            if status == 404:
                raise BlobNotFound(f"no checkpoint directory at {url} (404)", url=url)
            raise FetchError(f"listing {url} returned HTTP 403 and the directory has no "
                             f"{' or '.join(named_files.PROBED)} naming its files: turn the "
                             f"server's directory listing on (nginx: autoindex on;)", url=url)
        if status != 200:
            raise FetchError(f"listing {url} returned HTTP {status}", url=url)
        kind = headers.get("content-type", "").lower()
        start = body.lstrip()[:1]
        if "json" in kind or start == b"[":
            return self._from_json_index(url, body)
        if "html" in kind or start == b"<":
            links = html_links(body.decode("utf-8", "replace"),
                               urllib.parse.urlsplit(url).path)
            out: dict[str, Attr | None] = {name: Attr(mode=DIR_MODE, size=0, mtime=0.0, nlink=2)
                                           for name, is_dir in links if is_dir}
            files = [name for name, is_dir in links if not is_dir]
            found = self._head_all([f"{rel}/{n}" if rel else n for n in files])
            out.update((n, a) for n, a in zip(files, found.values(), strict=True) if a is not None)
            return out
        raise StoreError(f"listing {url} is neither a JSON autoindex nor an HTML index page "
                         f"(Content-Type {kind or 'none'})", url=url)

    @staticmethod
    def _from_json_index(url: str, body: bytes) -> dict[str, Attr | None]:
        try:
            items = json.loads(body)
            if not isinstance(items, list):
                raise ValueError("not a list")
        except ValueError as e:
            raise StoreError(f"listing {url} is not a JSON autoindex (nginx: autoindex on; "
                             "autoindex_format json;)", url=url) from e
        out: dict[str, Attr | None] = {}
        for it in items:
            mtime = http_date(it.get("mtime")) or 0.0
            if it.get("type") == "directory":
                out[it["name"]] = Attr(mode=DIR_MODE, size=0, mtime=mtime, nlink=2)
            elif it.get("type") == "file":
                out[it["name"]] = Attr(mode=FILE_MODE, size=int(it.get("size", 0)), mtime=mtime)
        return out

    def _list_named(self, rel: str) -> dict[str, Attr | None] | None:
        """The entries of ``rel`` as its checkpoint metadata names them (subdirectories it
        names are filled in too), or None when it holds no such metadata."""
        base = f"{rel}/" if rel else ""
        probed = self._head_all([base + n for n in named_files.PROBED])
        present = {p[len(base):]: a for p, a in probed.items() if a is not None}
        if not present:
            return None
        named: set[str] = set()
        for name, a in present.items():
            if name == named_files.SAFETENSORS_SINGLE:
                continue
            if a.size > named_files.MAX_METADATA_BYTES:
                raise StoreError(f"{self.url_of(base + name)}: {a.size} bytes of metadata, "
                                 f"more than bootseer reads to name a checkpoint's files")
            data = self._get(base + name)
            try:
                named.update(clean(n) for n in named_files.named_by(name, data))
            except (named_files.NotCheckpointMetadata, PathOutsideRoot) as e:
                raise StoreError(f"{self.url_of(base + name)}: {e}",
                                 url=self.url_of(base + name)) from None
        found = self._head_all([base + n for n in sorted(named - set(present))])
        for path, got in found.items():
            if got is None:
                log.warning("%s names %s, which the server does not have",
                            redact.url(self.url_of(rel)), redact.url(self.url_of(path)))
        files = {p[len(base):]: a for p, a in found.items() if a is not None} | present
        dirs: dict[str, dict[str, Attr | None]] = {rel: {}}
        for path, a in files.items():
            parts = path.split("/")
            for depth in range(len(parts)):
                where = "/".join(filter(None, [rel, *parts[:depth]]))
                entry = a if depth == len(parts) - 1 else Attr(mode=DIR_MODE, size=0,
                                                                mtime=0.0, nlink=2)
                dirs.setdefault(where, {})[parts[depth]] = entry
        with self._lock:
            for where, entries in dirs.items():
                if where != rel:
                    self._dirs.setdefault(where, entries)
        return dirs[rel]

    def _get(self, rel: str) -> bytes:
        status, _h, body, url = _get_following(self.url_of(rel))
        if status != 200:
            raise FetchError(f"reading {url} returned HTTP {status}", url=url)
        return body

    def _head_all(self, paths: list[str]) -> dict[str, Attr | None]:
        """``_probe`` of each path (relative), 16 at a time: an HTML listing or metadata
        gives names, the server's HEAD the size and time every read is checked against."""
        if len(paths) <= 1:
            return {p: self._probe(p) for p in paths}
        with ThreadPoolExecutor(max_workers=min(16, len(paths)),
                                thread_name_prefix="bootseer-ckpt-head") as pool:
            return dict(zip(paths, pool.map(self._probe, paths), strict=True))

    def _list_fsspec(self, rel: str) -> dict[str, Attr | None]:
        path = posixpath.join(self.root, rel) if rel else self.root
        try:
            items = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            raise BlobNotFound(f"no checkpoint directory at {self.url_of(rel)}",
                               url=self.url_of(rel)) from None
        except OSError as e:
            raise FetchError(f"listing {self.url_of(rel)} failed: {e}", url=self.url) from e
        out: dict[str, Attr | None] = {}
        for it in items:
            name = posixpath.basename(it["name"].rstrip("/"))
            stamp = FsspecFileSource.stamp(it)
            mtime = stamp if isinstance(stamp, (int, float)) else 0.0
            if it["type"] == "directory":
                out[name] = Attr(mode=DIR_MODE, size=0, mtime=mtime, nlink=2)
            else:
                out[name] = Attr(mode=FILE_MODE, size=int(it["size"]), mtime=mtime)
        return out

    def _probe(self, rel: str) -> Attr | None:
        from bootseer.store.http import request
        status, h, _ = request("HEAD", self.url_of(rel),
                               headers=credentials.auth_headers(self.url_of(rel)))
        if status != 200:
            return None
        return Attr(mode=FILE_MODE, size=int(h.get("content-length", 0)),
                    mtime=http_date(h.get("last-modified")) or 0.0)


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def html_links(page: str, dir_path: str | None = None) -> list[tuple[str, bool]]:
    """(name, is a directory) of the entries an HTML index page links to: links to direct
    children only, relative (``a.bin``, ``./a.bin``) or under the page's own path
    ``dir_path`` (IIS writes ``/ckpt/a.bin``); not ``../``, sort links such as Apache's
    ``?C=N;O=D``, other paths or other hosts. ``name/`` is a directory."""
    parser = _Links()
    parser.feed(page)
    base = urllib.parse.unquote(dir_path).rstrip("/") + "/" if dir_path else None
    out: dict[str, bool] = {}
    for href in parser.hrefs:
        u = urllib.parse.urlsplit(href)
        if u.scheme or u.netloc or u.query or u.fragment:
            continue
        path = urllib.parse.unquote(u.path)
        if path.startswith("/"):
            if base is None or not path.startswith(base):
                continue
            path = path[len(base):]
        is_dir = path.endswith("/")
        name = path.rstrip("/")
        while name.startswith("./"):
            name = name[2:]
        if not name or "/" in name or name in (".", ".."):
            continue
        out.setdefault(name, is_dir)
    return list(out.items())
