"""Write a tree: chunk regular files, compress chunks (zstd), pack them into ~64 MiB
blobs, write the TOC. Identical chunks (same sha256) are stored once."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable

from bootseer.errors import BootseerError
from bootseer.store.digest import sha256_digest
from bootseer.tree import format as fmt

CHUNK = 1 << 20
PACK = 64 << 20


class TreeBuildError(BootseerError):
    pass


class TreeBuilder:
    def __init__(self, store, *, chunk_size: int = CHUNK, pack_size: int = PACK, level: int = 3,
                 progress: Callable[[int], None] | None = None):
        import zstandard
        self.store, self.chunk_size, self.pack_size = store, chunk_size, pack_size
        self._zc = zstandard.ZstdCompressor(level=level)
        self.entries: dict[str, dict] = {}
        self.packs: list[str] = []
        self._pack = bytearray()
        self._seen: dict[str, list] = {}
        self._pending: list[list] = []   # chunk refs into the open pack (index patched on flush)
        self._links: dict[str, list[str]] = {}   # file path -> hard links naming it
        self.progress = progress
        self.stats = {"files": 0, "bytes": 0, "chunks": 0, "dedup_chunks": 0, "stored_bytes": 0}

    # -- entries ------------------------------------------------------------------------------
    @staticmethod
    def _norm(path: str) -> str:
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if any(p == ".." for p in parts):
            raise TreeBuildError(f"path {path!r} escapes the tree ('..')")
        return "/" + "/".join(parts)

    def _put(self, path: str, entry: dict) -> None:
        path = self._norm(path)
        entry["path"] = path
        parent = path.rsplit("/", 1)[0] or "/"
        if path != "/":
            pe = self.entries.get(parent)
            if pe is None:
                self.add_dir(parent)
            elif pe["type"] != "d":   # a reader would never reach it (or follow the link)
                kind = "a symlink" if pe["type"] == "l" else "not a directory"
                raise TreeBuildError(f"cannot add {path}: its parent {parent} is {kind}")
        old = self.entries.get(path)
        if old is not None and not (old["type"] == "d" and entry["type"] == "d"):
            self.remove(path)   # what was there goes, with anything under it
        self.entries[path] = entry

    def add_dir(self, path: str, mode: int = 0o755, uid: int = 0, gid: int = 0,
                mtime: float = 0.0, xattrs: dict | None = None) -> None:
        self._put(path, {"type": "d", "mode": mode & 0o7777, "uid": uid, "gid": gid,
                         "mtime": mtime, "size": 0, **({"xattrs": xattrs} if xattrs else {})})

    def add_symlink(self, path: str, target: str, uid: int = 0, gid: int = 0,
                    mtime: float = 0.0) -> None:
        self._put(path, {"type": "l", "mode": 0o777, "uid": uid, "gid": gid, "mtime": mtime,
                         "size": len(target.encode()), "target": target})

    def add_hardlink(self, path: str, target: str) -> None:
        """A second name for ``target`` as it is now: should ``target`` later be removed or
        replaced (a later layer), the link keeps this content (see ``_unlink``)."""
        path, target = self._norm(path), self._norm(target)
        te = self.entries.get(target)
        if te is not None and te["type"] == "h":
            target, te = te["target"], self.entries[te["target"]]
        what = ("not in the tree" if te is None else "itself" if path == target
                else "a directory" if te["type"] == "d" else "")
        if what:
            raise TreeBuildError(f"hard link {path} names {target}, which is {what}")
        if te["type"] != "f":   # a link to a symlink or a fifo: the same entry again
            self._put(path, {k: dict(v) if isinstance(v, dict) else v for k, v in te.items()})
            return
        self._put(path, {"type": "h", "target": target, "mode": 0, "uid": 0,
                         "gid": 0, "mtime": 0.0, "size": 0})
        self._links.setdefault(target, []).append(path)

    def add_special(self, path: str, kind: str, mode: int, rdev: int = 0, uid: int = 0,
                    gid: int = 0, mtime: float = 0.0) -> None:
        """Device nodes and fifos are recorded (never served: the mount is nodev)."""
        self._put(path, {"type": kind, "mode": mode & 0o7777, "uid": uid, "gid": gid,
                         "mtime": mtime, "size": 0, "rdev": rdev})

    def add_file(self, path: str, src: BinaryIO | bytes, mode: int = 0o644, uid: int = 0,
                 gid: int = 0, mtime: float = 0.0, xattrs: dict | None = None) -> None:
        chunks, size = [], 0
        read = (io.BytesIO(src) if isinstance(src, (bytes, bytearray)) else src).read
        while True:
            data = read(self.chunk_size)
            if not data:
                break
            size += len(data)
            chunks.append(self._chunk(data))
        self.stats["files"] += 1
        self.stats["bytes"] += size
        self._put(path, {"type": "f", "mode": mode & 0o7777, "uid": uid, "gid": gid,
                         "mtime": mtime, "size": size, "chunks": chunks,
                         **({"xattrs": xattrs} if xattrs else {})})

    def remove(self, path: str) -> None:
        """Whiteout: drop ``path`` and everything under it. Also called before every file
        a layer adds, so the common cases (absent, not a directory) cost no scan: parents
        are always entries, so an absent path has nothing under it."""
        path = self._norm(path)
        e = self.entries.get(path)
        if e is None:
            return
        if e["type"] != "d":
            self._unlink(path)
            return
        for p in [p for p in self.entries if p == path or p.startswith(path + "/")]:
            self._unlink(p)

    def clear_dir(self, path: str, keep: set[str] | frozenset = frozenset()) -> None:
        """Opaque directory: keep the directory, drop what lower layers put in it (all but
        the paths in ``keep``: what the opaque layer itself added)."""
        path = self._norm(path)
        prefix = path.rstrip("/") + "/"
        for p in [p for p in self.entries if p.startswith(prefix) and p not in keep]:
            self._unlink(p)

    def _unlink(self, path: str) -> None:
        """Drop one entry. A regular file with hard links to it hands its content to the
        first link, which the others then name: a link keeps the bytes it had in its layer
        (as in an overlay filesystem), whatever later layers do to the first path."""
        e = self.entries.pop(path, None)
        if e is None or e["type"] != "f":
            return
        links = sorted(p for p in self._links.pop(path, ())
                       if (le := self.entries.get(p)) is not None and le["type"] == "h"
                       and le["target"] == path)
        if not links:
            return
        heir, rest = links[0], links[1:]
        self.entries[heir] = {**e, "path": heir}   # the chunk list is shared, not copied
        for p in rest:
            self.entries[p]["target"] = heir
        if rest:
            self._links[heir] = rest

    # -- chunks and packs ---------------------------------------------------------------------
    def _chunk(self, data: bytes) -> list:
        digest = sha256_digest(data)
        self.stats["chunks"] += 1
        if digest in self._seen:
            self.stats["dedup_chunks"] += 1
            return list(self._seen[digest])
        comp = self._zc.compress(data)
        ref = [digest, -1, len(self._pack), len(comp), len(data)]
        self._pack += comp
        self._pending.append(ref)
        self._seen[digest] = ref
        if self.progress:
            self.progress(len(data))
        if len(self._pack) >= self.pack_size:
            self._flush()
        return ref

    def _flush(self) -> None:
        if not self._pack:
            return
        data = bytes(self._pack)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.store.write(digest, data)
        self.stats["stored_bytes"] += len(data)
        index = len(self.packs)
        self.packs.append(digest)
        for ref in self._pending:
            ref[1] = index
        self._pending = []
        self._pack = bytearray()

    def finish(self, meta: dict | None = None) -> str:
        """Write the last pack and the TOC; return the tree digest."""
        self._flush()
        if "/" not in self.entries:
            self.add_dir("/")
        # chunk lists were copied before their pack index was known: resolve from _seen
        for e in self.entries.values():
            if e["type"] == "f":
                e["chunks"] = [list(self._seen[c[0]]) for c in e["chunks"]]
        toc = {"v": fmt.VERSION, "kind": fmt.KIND, "chunk_size": self.chunk_size,
               "packs": self.packs, "meta": meta or {},
               "entries": [self.entries[p] for p in sorted(self.entries)]}
        blob = fmt.encode(toc)
        digest = sha256_digest(blob)
        self.store.write(digest, blob)
        return digest


def _xattrs(path: str) -> dict:
    out = {}
    try:
        for name in os.listxattr(path, follow_symlinks=False):
            out[name] = base64.b64encode(os.getxattr(path, name, follow_symlinks=False)).decode()
    except OSError:
        pass
    return out


def add_directory(builder: TreeBuilder, root: str | Path, prefix: str = "/", *,
                  refuse_devices: bool = False) -> None:
    """Add everything under ``root`` (symlinks kept as links, hard links detected)."""
    root = Path(root)
    inodes: dict[tuple[int, int], str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in [".", *sorted(filenames), *dirnames]:
            full = os.path.join(dirpath, name) if name != "." else dirpath
            rel = os.path.normpath(os.path.join(prefix, rel_dir, name if name != "." else ""))
            st = os.lstat(full)
            kw = dict(uid=st.st_uid, gid=st.st_gid, mtime=st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                if name == "." or os.path.islink(full):
                    if os.path.islink(full):
                        builder.add_symlink(rel, os.readlink(full), **kw)
                    else:
                        builder.add_dir(rel, st.st_mode, xattrs=_xattrs(full), **kw)
                continue
            if stat.S_ISLNK(st.st_mode):
                builder.add_symlink(rel, os.readlink(full), **kw)
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in inodes:
                    builder.add_hardlink(rel, inodes[key])
                    continue
                inodes[key] = rel
                with open(full, "rb") as f:
                    builder.add_file(rel, f, st.st_mode, xattrs=_xattrs(full), **kw)
            else:
                kind = {stat.S_IFCHR: "c", stat.S_IFBLK: "b", stat.S_IFIFO: "p"}.get(
                    stat.S_IFMT(st.st_mode))
                if kind is None or (refuse_devices and kind in "cb"):
                    raise TreeBuildError(f"{full}: cannot snapshot this file type "
                                         f"(mode {oct(st.st_mode)})")
                builder.add_special(rel, kind, st.st_mode, st.st_rdev, **kw)
