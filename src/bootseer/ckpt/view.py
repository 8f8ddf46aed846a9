"""A remote checkpoint directory as a TreeView for :mod:`bootseer.mount`.

Listings come from nginx's JSON autoindex for ``http(s)://`` and from ``fs.ls`` for any
other fsspec URL; each directory is listed once and its entries (size, mtime) are the
identity every later read is checked against. One reader per open file, all over one
engine (one memory budget).
"""

from __future__ import annotations

import json
import posixpath
import stat
import threading
import time
import urllib.parse

from bootseer.ckpt.source import FsspecFileSource, HttpFileSource, http_date
from bootseer.ckpt.striped import Engine
from bootseer.errors import BlobNotFound, FetchError, StoreError
from bootseer.mount.view import Attr

DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444


class PathOutsideRoot(PermissionError):
    pass


def clean(path: str) -> str:
    """'/a/b' -> 'a/b'; refuses anything that would leave the mounted root."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts or any("\\" in p or "\0" in p for p in parts):
        raise PathOutsideRoot(f"path {path!r} leaves the mounted root")
    return "/".join(parts)


class RemoteDirView:
    def __init__(self, url: str, engine: Engine, *, mode: str = "striped",
                 stats_path: str | None = None):
        self.url, self.engine, self.mode = url.rstrip("/"), engine, mode
        self.stats_path = stats_path
        self.started = time.monotonic()
        self._consumed = 0
        self._first_byte_s: float | None = None
        self.http = self.url.startswith(("http://", "https://"))
        if not self.http:
            import fsspec
            if "://" not in self.url:
                import os
                self.url = "file://" + os.path.abspath(self.url)
            self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self._dirs: dict[str, dict[str, Attr]] = {}
        self._lock = threading.Lock()
        self._readers: dict[str, tuple[object, int]] = {}
        self.getattr("/")  # fail at mount, not at first use, when the root is wrong

    # -- listing ------------------------------------------------------------------------------
    def _list(self, rel: str) -> dict[str, Attr]:
        with self._lock:
            hit = self._dirs.get(rel)
        if hit is not None:
            return hit
        entries = self._list_http(rel) if self.http else self._list_fsspec(rel)
        with self._lock:
            self._dirs[rel] = entries
        return entries

    def _list_http(self, rel: str) -> dict[str, Attr]:
        from bootseer.store.http import request
        url = self._url(rel) + "/"
        status, h, body = request("GET", url)
        if status == 404:
            raise FileNotFoundError(f"{url} not found (404)")
        if status != 200:
            raise FetchError(f"listing {url} returned HTTP {status}", url=url)
        try:
            items = json.loads(body)
        except ValueError as e:
            raise StoreError(f"listing {url} is not a JSON autoindex (nginx: autoindex on; "
                             "autoindex_format json;)", url=url) from e
        out = {}
        for it in items:
            mtime = http_date(it.get("mtime")) or 0.0
            if it.get("type") == "directory":
                out[it["name"]] = Attr(mode=DIR_MODE, size=0, mtime=mtime, nlink=2)
            elif it.get("type") == "file":
                out[it["name"]] = Attr(mode=FILE_MODE, size=int(it.get("size", 0)), mtime=mtime)
        return out

    def _list_fsspec(self, rel: str) -> dict[str, Attr]:
        path = posixpath.join(self.root, rel) if rel else self.root
        try:
            items = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise FetchError(f"listing {self.url}/{rel} failed: {e}", url=self.url) from e
        out = {}
        for it in items:
            name = posixpath.basename(it["name"].rstrip("/"))
            stamp = FsspecFileSource.stamp(it)
            mtime = stamp if isinstance(stamp, (int, float)) else 0.0
            if it["type"] == "directory":
                out[name] = Attr(mode=DIR_MODE, size=0, mtime=mtime, nlink=2)
            else:
                out[name] = Attr(mode=FILE_MODE, size=int(it["size"]), mtime=mtime)
        return out

    def _url(self, rel: str) -> str:
        return self.url + ("/" + urllib.parse.quote(rel) if rel else "")

    # -- TreeView -----------------------------------------------------------------------------
    def getattr(self, path: str) -> Attr:
        rel = clean(path)
        if not rel:
            if not self.http and not self.fs.isdir(self.root):
                raise FileNotFoundError(f"{self.url} is not a directory")
            if self.http:
                self._list("")
            return Attr(mode=DIR_MODE, size=0, mtime=time.time(), nlink=2)
        parent, _, name = rel.rpartition("/")
        entries = self._list(parent)
        a = entries.get(name)
        if a is None and self.http and name.startswith("."):
            a = self._probe(rel)
            with self._lock:
                entries[name] = a  # negative entries too: one probe per name
        if a is None:
            raise FileNotFoundError(path)
        return a

    def _probe(self, rel: str) -> Attr | None:
        """nginx's autoindex hides dot files (DCP's ``.metadata``): ask for them by name."""
        from bootseer.store.http import request
        status, h, _ = request("HEAD", self._url(rel))
        if status != 200:
            return None
        return Attr(mode=FILE_MODE, size=int(h.get("content-length", 0)),
                    mtime=http_date(h.get("last-modified")) or 0.0)

    def readdir(self, path: str) -> list[str]:
        rel = clean(path)
        if self.http:  # show DCP's hidden .metadata too when it is there
            try:
                self.getattr(f"/{rel}/.metadata" if rel else "/.metadata")
            except FileNotFoundError:
                pass
        return [n for n, a in self._list(rel).items() if a is not None]

    def readlink(self, path: str) -> str:
        raise OSError(22, "not a symlink", path)

    def source(self, path: str):
        rel = clean(path)
        a = self.getattr(path)
        if a.is_dir:
            raise IsADirectoryError(path)
        if self.http:
            return HttpFileSource(self._url(rel), a.size, a.mtime or None)
        full = posixpath.join(self.root, rel)
        info = self.fs.info(full)
        return FsspecFileSource(self.fs, full, a.size, FsspecFileSource.stamp(info),
                                url=self._url(rel))

    def _reader(self, path: str):
        with self._lock:
            hit = self._readers.get(path)
            if hit is not None:
                return hit[0]
        r = self.engine.reader(self.source(path), self.mode)
        with self._lock:
            hit = self._readers.setdefault(path, (r, 0))
        if hit[0] is not r:
            r.close()
        return hit[0]

    def open(self, path: str) -> None:
        r = self._reader(path)
        with self._lock:
            self._readers[path] = (r, self._readers[path][1] + 1)

    def release(self, path: str) -> None:
        with self._lock:
            r, n = self._readers.get(path, (None, 0))
            if r is None:
                return
            if n <= 1:
                del self._readers[path]
            else:
                self._readers[path] = (r, n - 1)
                r = None
        if r is not None:
            self._account(r)
            r.close()

    def _account(self, r) -> None:
        with self._lock:
            self._consumed += r.consumed
            if r.first_byte_s is not None and self._first_byte_s is None:
                self._first_byte_s = r.opened + r.first_byte_s - self.started

    def stats(self) -> dict:
        """The load report: time to first byte (s, since mount), throughput (bytes/s),
        bytes fetched versus consumed, stall seconds, peak stripe memory."""
        with self._lock:
            live = list(self._readers.values())
        consumed = self._consumed + sum(r.consumed for r, _ in live)
        e = self.engine.stats()
        elapsed = time.monotonic() - self.started
        return {"url": self.url, "mode": self.mode, "first_byte_s": self._first_byte_s,
                "bytes_consumed": consumed, "bytes_fetched": e["bytes"],
                "requests": e["requests"], "retries": e["retries"], "stall_s": e["stall_s"],
                "memory_budget_bytes": self.engine.budget.total,
                "memory_peak_bytes": e["budget_peak"], "budget_waits": e["budget_waits"],
                "elapsed_s": elapsed, "fetched_bytes_per_s": e["bytes"] / max(elapsed, 1e-9)}

    def read(self, path: str, size: int, offset: int) -> bytes:
        return self._reader(path).read(offset, size)

    def statfs(self) -> dict:
        return {"f_bsize": 1 << 20, "f_frsize": 1 << 20, "f_namemax": 255}

    def close(self) -> None:
        if self.stats_path:
            import os
            tmp = f"{self.stats_path}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.stats(), f)
            os.replace(tmp, self.stats_path)
        self.engine.close()


def _build_view(url: str, mode: str, config) -> "RemoteDirView":
    from bootseer.config import BootseerConfig
    cfg = config or BootseerConfig.from_env()
    return RemoteDirView(url, Engine(cfg.ckpt, cfg.fetch), mode=mode)


def view_factory(url: str, *, mode: str = "striped", config=None):
    """For :func:`bootseer.mount.fuse.mount`: the view is built in the server process
    (a partial of a module-level function, so it pickles into the spawned server)."""
    import functools
    return functools.partial(_build_view, url, mode, config)


__all__ = ["RemoteDirView", "view_factory", "PathOutsideRoot", "BlobNotFound"]
