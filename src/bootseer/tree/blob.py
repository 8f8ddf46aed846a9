"""A tree as one data blob plus an EROFS metadata image (the kernel path of a lazy mount).

The blob holds every distinct chunk of the tree once, uncompressed, each at a 4 KiB
boundary, in TOC order (a package's files side by side). The layout depends on the tree
alone, never on a profile, so the metadata image pointing into it is made once, when the
tree is built (``bootseer.tree.meta_image``), and one local blob serves every profile;
the start's hot chunks are found through the files holding them (the pre-read follows
exact ranges, ``bootseer.tree.preread``). A blob offset maps back to one chunk digest,
so reads are verified, cached, recorded and prefetched per chunk exactly as on the
FUSE tree view, and profiles stay the same format. Dedup across trees stays in the node
cache and the store (content-addressed chunks); inside one blob a chunk appears once.

* :class:`BlobLayout`: where each chunk sits, and a key naming the layout;
* :func:`erofs_root`: the TOC as writer inodes pointing into that layout;
* :class:`BlobView`: the one-file view a FUSE server mounts while the blob is incomplete;
* :func:`write_blob` / :func:`assemble` / :func:`verify_blob`: the complete blob as a
  local file, written by the one chunk writer (``bootseer.tree.writer``), checked chunk
  by chunk against the digests.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import itertools
import os
import stat

from bootseer.errors import DigestMismatch
from bootseer.mount.erofs import BLOB_NAME
from bootseer.mount.erofs.layout import BLOCK, blocks_for
from bootseer.mount.erofs.writer import Inode
from bootseer.mount.view import Attr
from bootseer.node.partfile import PartFile
from bootseer.tree.toc import ChunkRef, Entry, Toc, TreeFormatError, records_without_cycles
from bootseer.tree.writer import ChunkWriter

LAYOUT_VERSION = b"bootseer.blob.v1"
_FMT = {"f": stat.S_IFREG, "d": stat.S_IFDIR, "l": stat.S_IFLNK, "c": stat.S_IFCHR,
        "b": stat.S_IFBLK, "p": stat.S_IFIFO}


def unsupported(toc: Toc) -> str | None:
    """Why this tree cannot be an EROFS image (None when it can)."""
    cs = toc.chunk_size
    if cs < BLOCK or cs & (cs - 1) or cs > BLOCK << 31:
        return f"its chunk size {cs} is not a power of two of at least {BLOCK} bytes"
    return None


class BlobLayout:
    """Made by every start that mounts a tree on the kernel path, in the mounting process
    and again in its blob server: one pass per table, no per-chunk method calls (a tree of
    30k files has as many chunks)."""

    def __init__(self, toc: Toc):
        with records_without_cycles():
            self._make(toc)

    def _make(self, toc: Toc) -> None:
        self.chunk_size = toc.chunk_size
        by_digest: dict[str, ChunkRef] = {}
        # a file holding the chunk, and its index there (profile rows name the path)
        self.where: dict[str, tuple[str, int]] = {}
        where = self.where
        for e in toc.entries:
            if e.chunks:
                path = e.path
                for i, c in enumerate(e.chunks):
                    if c.digest not in by_digest:
                        by_digest[c.digest] = c
                        where[c.digest] = (path, i)
        self.ref_of = by_digest
        self.refs: list[ChunkRef] = list(by_digest.values())
        spans = [max(blocks_for(c.size), 1) for c in self.refs]
        starts = list(itertools.accumulate(spans, initial=0))
        self.blocks = starts.pop()
        self.block_of: dict[str, int] = dict(zip(by_digest, starts, strict=True))
        self.offsets: list[int] = [blk * BLOCK for blk in starts]
        self.size = self.blocks * BLOCK
        h = hashlib.sha256(LAYOUT_VERSION + b"\0%d\0" % self.chunk_size)
        h.update(b"".join([b"%s:%d\0" % (c.digest.encode(), c.size) for c in self.refs]))
        self.key = h.hexdigest()

    def locate(self, offset: int) -> int:
        """Index of the chunk slot holding blob byte ``offset``."""
        return bisect.bisect_right(self.offsets, offset) - 1


def _xattrs(e: Entry) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (e.xattrs or {}).items()}


def erofs_root(toc: Toc, layout: BlobLayout) -> tuple[Inode, dict]:
    """The TOC as writer inodes (the root directory), and counts of what was left out."""
    root = None
    inodes: dict[str, Inode] = {}
    skipped = {"hardlinks_to_missing": 0}
    entries = sorted(toc.entries, key=lambda e: e.path)
    for e in entries:
        if e.path in ("/", ""):
            root = inodes["/"] = Inode(stat.S_IFDIR, e.mode, e.uid, e.gid, e.mtime,
                                       xattrs=_xattrs(e), entries={})
            break
    if root is None:
        root = inodes["/"] = Inode(stat.S_IFDIR, 0o755, entries={})
    for e in entries:
        path, kind = e.path, e.type
        if path == "/" or kind == "h":
            continue
        if kind not in _FMT:
            raise TreeFormatError(f"entry {path} has unknown type {kind!r}")
        node = Inode(_FMT[kind], e.mode, e.uid, e.gid, e.mtime, xattrs=_xattrs(e))
        if kind == "d":
            node.entries = {}
        elif kind == "f":
            node.size = e.size
            node.chunk_blocks = ([layout.block_of[c.digest] for c in e.chunks or ()]
                                 if e.size else None)
        elif kind == "l":
            node.target = os.fsencode(e.target or "")
        else:
            node.rdev = e.rdev or 0
        inodes[path] = node
        _parent(inodes, path)[_name(path)] = node
    for e in entries:
        if e.type == "h":
            target = inodes.get(e.target or "")
            if target is None or stat.S_ISDIR(target.fmt):
                skipped["hardlinks_to_missing"] += 1
                continue
            _parent(inodes, e.path)[_name(e.path)] = target
    return root, skipped


def _name(path: str) -> bytes:
    return os.fsencode(path.rsplit("/", 1)[1])


def _parent(inodes: dict[str, Inode], path: str) -> dict[bytes, Inode]:
    """The entries of the directory holding ``path``, made (0755, root) when the TOC lacks
    it."""
    parent = path.rsplit("/", 1)[0] or "/"
    d = inodes.get(parent)
    if d is None:
        d = inodes[parent] = Inode(stat.S_IFDIR, 0o755, entries={})
        if parent != "/":
            _parent(inodes, parent)[_name(parent)] = d
    if d.entries is None:
        raise TreeFormatError(f"{path}: its parent {parent} is not a directory")
    return d.entries


class BlobView:
    """The blob as a one-file tree view (``/blob``) over a TreeReader: each range read
    maps to chunk slices, served from the node cache or fetched (verified, recorded)."""

    def __init__(self, reader, layout: BlobLayout, on_close=None):
        self.reader, self.layout, self._on_close = reader, layout, on_close

    def getattr(self, path: str) -> Attr:
        if path == "/":
            return Attr(mode=stat.S_IFDIR | 0o555, size=0, nlink=2)
        if path == f"/{BLOB_NAME}":
            return Attr(mode=stat.S_IFREG | 0o444, size=self.layout.size)
        raise FileNotFoundError(path)

    def readdir(self, path: str) -> list[str]:
        if path != "/":
            raise NotADirectoryError(path)
        return [BLOB_NAME]

    def readlink(self, path: str) -> str:
        raise OSError(22, "not a symlink", path)

    def read(self, path: str, size: int, offset: int) -> bytes:
        if path != f"/{BLOB_NAME}":
            raise FileNotFoundError(path) if path != "/" else IsADirectoryError(path)
        lay = self.layout
        end = min(offset + size, lay.size)
        out, pos = [], offset
        i = lay.locate(pos)
        while pos < end:
            start, ref = lay.offsets[i], lay.refs[i]
            slot_end = lay.offsets[i + 1] if i + 1 < len(lay.refs) else lay.size
            data_end = start + ref.size
            if pos < data_end:
                lo, hi = pos - start, min(end, data_end) - start
                out.append(self._slice(ref, lo, hi))
                pos = start + hi
            else:   # the zero padding up to the next block boundary
                stop = min(end, slot_end)
                out.append(bytes(stop - pos))
                pos = stop
            if pos >= slot_end:
                i += 1
        return b"".join(out)

    def _slice(self, ref: ChunkRef, lo: int, hi: int) -> bytes:
        # the reader keeps the last chunks in memory, verified: the kernel's smaller
        # reads of one chunk cost neither a re-read nor a re-hash (a hot pack's blocks,
        # when they cover the range, serve it without the chunk)
        return self.reader.part(ref, self.layout.where[ref.digest][0], lo, hi)

    def statfs(self) -> dict:
        return {"f_bsize": BLOCK, "f_frsize": BLOCK, "f_blocks": self.layout.blocks,
                "f_bfree": 0, "f_bavail": 0, "f_files": 1, "f_ffree": 0, "f_namemax": 255}

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()


def all_local(layout: BlobLayout, cache) -> bool:
    return all(cache.contains(c.digest) for c in layout.refs)


def write_blob(layout: BlobLayout, fd: int, writer: ChunkWriter) -> None:
    """Write every chunk of the layout at its slot in the blob file open at ``fd`` and
    size the file to the layout (the padding reads as zeros). ``writer`` was made for
    ``layout.refs``."""
    for ref, offset in zip(layout.refs, layout.offsets, strict=True):
        writer.write(fd, ref, offset)
    os.ftruncate(fd, layout.size)


def assemble(layout: BlobLayout, cache, dest: str) -> None:
    """Write the complete blob from the node cache's chunks (each verified as it is
    read) to ``dest``, atomically. A chunk missing or bad raises FileNotFoundError."""
    def from_cache(ref: ChunkRef, _path: str) -> bytes:
        data = cache.get(ref.digest, ref.size)   # verified; None if missing or bad
        if data is None:
            raise FileNotFoundError(f"chunk {ref.digest} is not (or no longer) in the "
                                    "node cache")
        return data
    # a part locked while written: one a killed assembly leaves is removed by the next mount
    with PartFile(dest) as part, ChunkWriter(layout.refs, local=from_cache) as writer:
        if part.fd is None:   # open until commit or close, neither of which came yet
            raise ValueError(f"{dest}: its part file is closed")
        write_blob(layout, part.fd, writer)
        part.commit()


def verify_blob(layout: BlobLayout, path: str) -> None:
    """Every chunk of a local blob still hashes to its digest and the padding between
    chunks is still zeros (DigestMismatch if not): no byte of it goes unchecked."""
    if os.path.getsize(path) != layout.size:
        raise DigestMismatch(f"blob {path} has {os.path.getsize(path)} bytes, its layout "
                             f"{layout.size}", digest=f"sha256:{layout.key}")
    fd = os.open(path, os.O_RDONLY)
    try:
        ends = layout.offsets[1:] + [layout.size]
        for off, end, ref in zip(layout.offsets, ends, layout.refs, strict=True):
            slot = os.pread(fd, end - off, off)
            if hashlib.sha256(slot[:ref.size]).hexdigest() != ref.digest.removeprefix("sha256:") \
                    or slot[ref.size:].strip(b"\0"):
                raise DigestMismatch(f"blob {path} is corrupt at offset {off} (chunk "
                                     f"{ref.digest})", digest=ref.digest)
    finally:
        os.close(fd)
