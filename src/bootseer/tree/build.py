"""Write a tree: chunk regular files, compress chunks (zstd), pack them into ~64 MiB
blobs, write the TOC. Identical chunks (same sha256) are stored once."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TypedDict

from bootseer.errors import BootseerError
from bootseer.store.digest import sha256_digest
from bootseer.tree import blocks as blk
from bootseer.tree import format as fmt
from bootseer.tree import meta_image
from bootseer.tree.toc import ChunkRef, Entry, Toc

CHUNK = 1 << 20
PACK = 64 << 20


class TreeBuildError(BootseerError):
    pass


class Owner(TypedDict):
    """An entry's owner and time, as every ``TreeBuilder.add_*`` takes them (``**owner``)."""
    uid: int
    gid: int
    mtime: float


@dataclass(frozen=True, slots=True)
class BuildStats:
    """What a build wrote: files and their bytes, chunks (``dedup_chunks`` of them stored
    once already), and the bytes of the packs written."""
    files: int = 0
    bytes: int = 0
    chunks: int = 0
    dedup_chunks: int = 0
    stored_bytes: int = 0


class TreeBuilder:
    def __init__(self, store, *, chunk_size: int = CHUNK, pack_size: int = PACK, level: int = 3,
                 progress: Callable[[int], None] | None = None, block_size: int = blk.BLOCK):
        import zstandard
        self.store, self.chunk_size, self.pack_size = store, chunk_size, pack_size
        self._zc = zstandard.ZstdCompressor(level=level)
        self.entries: dict[str, Entry] = {}
        self.packs: list[str] = []
        self._pack = bytearray()
        self._seen: dict[str, ChunkRef] = {}   # the pack index is -1 until its pack is flushed
        self._pending: list[str] = []   # digests of the chunks in the open pack
        self._links: dict[str, list[str]] = {}   # file path -> hard links naming it
        self.progress = progress
        # each distinct chunk's block digests (bootseer.tree.blocks), when blocks tile chunks
        self._block_size = block_size if blk.usable(chunk_size, block_size) else 0
        self._block_table: dict[str, bytes] = {}
        self._files = self._bytes = self._chunks = self._dedup = self._stored = 0

    @property
    def stats(self) -> BuildStats:
        return BuildStats(self._files, self._bytes, self._chunks, self._dedup, self._stored)

    # -- entries ------------------------------------------------------------------------------
    @staticmethod
    def _norm(path: str) -> str:
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if any(p == ".." for p in parts):
            raise TreeBuildError(f"path {path!r} escapes the tree ('..')")
        return "/" + "/".join(parts)

    def _put(self, path: str, kind: str, mode: int, uid: int, gid: int, mtime: float,
             size: int, **fields) -> None:
        path = self._norm(path)
        parent = path.rsplit("/", 1)[0] or "/"
        if path != "/":
            pe = self.entries.get(parent)
            if pe is None:
                self.add_dir(parent)
            elif pe.type != "d":   # a reader would never reach it (or follow the link)
                what = "a symlink" if pe.type == "l" else "not a directory"
                raise TreeBuildError(f"cannot add {path}: its parent {parent} is {what}")
        old = self.entries.get(path)
        if old is not None and not (old.type == "d" and kind == "d"):
            self.remove(path)   # what was there goes, with anything under it
        self.entries[path] = Entry(path, kind, mode, uid, gid, mtime, size, **fields)

    def add_dir(self, path: str, mode: int = 0o755, uid: int = 0, gid: int = 0,
                mtime: float = 0.0, xattrs: dict | None = None) -> None:
        self._put(path, "d", mode & 0o7777, uid, gid, mtime, 0, xattrs=xattrs or None)

    def add_symlink(self, path: str, target: str, uid: int = 0, gid: int = 0,
                    mtime: float = 0.0) -> None:
        self._put(path, "l", 0o777, uid, gid, mtime, len(target.encode()), target=target)

    def add_hardlink(self, path: str, target: str) -> None:
        """A second name for ``target`` as it is now: should ``target`` later be removed or
        replaced (a later layer), the link keeps this content (see ``_unlink``)."""
        path, target = self._norm(path), self._norm(target)
        te = self.entries.get(target)
        if te is not None and te.type == "h":
            assert te.target is not None
            target, te = te.target, self.entries[te.target]
        what = ("not in the tree" if te is None else "itself" if path == target
                else "a directory" if te.type == "d" else "")
        if what:
            raise TreeBuildError(f"hard link {path} names {target}, which is {what}")
        assert te is not None
        if te.type != "f":   # a link to a symlink or a fifo: the same entry again
            self._put(path, te.type, te.mode, te.uid, te.gid, te.mtime, te.size,
                      target=te.target, rdev=te.rdev, xattrs=te.xattrs)
            return
        self._put(path, "h", 0, 0, 0, 0.0, 0, target=target)
        self._links.setdefault(target, []).append(path)

    def add_special(self, path: str, kind: str, mode: int, rdev: int = 0, uid: int = 0,
                    gid: int = 0, mtime: float = 0.0) -> None:
        """Device nodes and fifos are recorded (never served: the mount is nodev)."""
        self._put(path, kind, mode & 0o7777, uid, gid, mtime, 0, rdev=rdev)

    def add_file(self, path: str, src: IO[bytes] | bytes, mode: int = 0o644, uid: int = 0,
                 gid: int = 0, mtime: float = 0.0, xattrs: dict | None = None) -> None:
        chunks: list[ChunkRef] = []
        size = 0
        read = (io.BytesIO(src) if isinstance(src, (bytes, bytearray)) else src).read
        while True:
            data = read(self.chunk_size)
            if not data:
                break
            size += len(data)
            chunks.append(self._chunk(data))
        self._files += 1
        self._bytes += size
        self._put(path, "f", mode & 0o7777, uid, gid, mtime, size, xattrs=xattrs or None,
                  chunks=tuple(chunks))

    def remove(self, path: str) -> None:
        """Whiteout: drop ``path`` and everything under it. Also called before every file
        a layer adds, so the common cases (absent, not a directory) cost no scan: parents
        are always entries, so an absent path has nothing under it."""
        path = self._norm(path)
        e = self.entries.get(path)
        if e is None:
            return
        if e.type != "d":
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
        if e is None or e.type != "f":
            return
        links = sorted(p for p in self._links.pop(path, ())
                       if (le := self.entries.get(p)) is not None and le.type == "h"
                       and le.target == path)
        if not links:
            return
        heir, rest = links[0], links[1:]
        self.entries[heir] = replace(e, path=heir)
        for p in rest:
            self.entries[p] = replace(self.entries[p], target=heir)
        if rest:
            self._links[heir] = rest

    # -- chunks and packs ---------------------------------------------------------------------
    def _chunk(self, data: bytes) -> ChunkRef:
        """The chunk's ref; its pack index is resolved in ``finish``."""
        digest = sha256_digest(data)
        self._chunks += 1
        if digest in self._seen:
            self._dedup += 1
            return self._seen[digest]
        comp = self._zc.compress(data)
        if self._block_size:
            self._block_table[digest] = blk.digests_of(data, self._block_size)
        ref = ChunkRef(digest, -1, len(self._pack), len(comp), len(data))
        self._pack += comp
        self._pending.append(digest)
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
        self._stored += len(data)
        index = len(self.packs)
        self.packs.append(digest)
        for d in self._pending:
            self._seen[d] = replace(self._seen[d], pack=index)
        self._pending = []
        self._pack = bytearray()

    def finish(self, meta: dict | None = None,
               erofs: tuple[str, ...] = ("tree",)) -> str:
        """Write the last pack, the EROFS metadata images of ``erofs``'s variants
        (``bootseer.tree.meta_image``: made once here, never at a start) and the TOC
        naming them; return the tree digest."""
        self._flush()
        if "/" not in self.entries:
            self.add_dir("/")
        # chunk lists were made before their pack index was known: resolve from _seen
        entries = tuple(
            replace(e, chunks=tuple(self._seen[c.digest] for c in e.chunks)) if e.chunks
            else e for e in (self.entries[p] for p in sorted(self.entries)))
        toc = Toc(self.chunk_size, tuple(self.packs), entries, meta or {})
        if self._block_size:
            toc = replace(toc, blocks=blk.build(toc, self._block_table, self.store,
                                                self._block_size))
        if erofs:
            toc = replace(toc, erofs=meta_image.stored(self.store, toc, erofs))
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
            kw: Owner = {"uid": st.st_uid, "gid": st.st_gid, "mtime": st.st_mtime}
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
