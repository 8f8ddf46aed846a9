"""Write an uncompressed EROFS metadata image whose regular files are chunk-indexed into
one extra device (the data blob).

Layout of the image (4 KiB blocks, ``meta_blkaddr`` 0, every inode in the 64-byte
extended form so uids, gids and mtimes are kept whole):

* block 0: the superblock at 1024 and the one device slot right after it;
* from block 1: the inodes, each followed by its inline xattrs and then either its chunk
  indexes (regular files: one 8-byte index per chunk naming device 1 and a blob block)
  or the tail of its data (directories and symlinks whose tail fits in the inode's
  block, as the kernel requires); the root directory comes first;
* then the full data blocks of directories and long symlinks.

Directories are written in the kernel's order: every dirent (``.`` and ``..`` included)
sorted by name bytes, packed into blocks (dirents first, then their names), so the
kernel's binary search finds them. Hard links are dirents that share an inode.
"""

from __future__ import annotations

import hashlib
import math
import stat
from dataclasses import dataclass, field

from bootseer.errors import MountError
from bootseer.mount.erofs import layout as L


class ImageError(MountError, ValueError):
    """A tree EROFS cannot represent (a bad name, a chunk list that does not fit)."""


@dataclass(eq=False, slots=True)
class Inode:
    """One file as the image will show it. ``fmt`` is the S_IFMT type, ``mode`` the
    permission bits; directories have ``entries`` (name bytes -> Inode), regular files
    with data have ``chunk_blocks`` (the blob block where each chunk starts)."""
    fmt: int
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    mtime: float = 0.0
    size: int = 0
    chunk_blocks: list[int] | None = None
    target: bytes = b""
    rdev: int = 0
    xattrs: dict[str, bytes] = field(default_factory=dict)
    entries: dict[bytes, Inode] | None = None


@dataclass(slots=True)
class _Placed:
    """The writer's decisions for one inode."""
    inode: Inode
    parent: Inode
    ino: int
    nid: int = 0
    nlink: int = 1
    layout: int = L.LAYOUT_FLAT_PLAIN
    xattr_body: bytes = b""
    data_size: int = 0          # directories: dirent bytes; symlinks: target length
    blkaddr: int = 0            # first block of the data area part
    data_blocks: int = 0        # full blocks in the data area


@dataclass(slots=True)
class ImageStats:
    inodes: int = 0
    blocks: int = 0
    skipped_xattrs: int = 0


def _align(n: int, unit: int) -> int:
    return (n + unit - 1) // unit * unit


def _xattr_name(name: str) -> tuple[int, bytes] | None:
    whole = L.XATTR_WHOLE_NAMES.get(name)
    if whole is not None:
        return whole, b""
    for prefix, index in L.XATTR_PREFIXES:
        if name.startswith(prefix):
            return index, name[len(prefix):].encode("utf-8", "surrogateescape")
    return None


def _xattr_body(xattrs: dict[str, bytes], stats: ImageStats) -> bytes:
    parts = []
    for name, value in sorted(xattrs.items()):
        named = _xattr_name(name)
        if named is None or len(named[1]) > 255 or len(value) > 0xFFFF:
            stats.skipped_xattrs += 1   # a namespace EROFS cannot name, or too large
            continue
        index, suffix = named
        entry = L.XATTR_ENTRY.pack(len(suffix), index, len(value)) + suffix + value
        parts.append(entry + b"\0" * (_align(len(entry), 4) - len(entry)))
    if not parts:
        return b""
    return L.XATTR_IBODY_HEADER.pack(0, 0, b"") + b"".join(parts)


def _entries(d: Inode) -> dict[bytes, Inode]:
    """A directory's entries; a directory without its list cannot be written."""
    if d.entries is None:
        raise ImageError("a directory has no entry list")
    return d.entries


def _dirents(p: _Placed) -> list[tuple[bytes, Inode]]:
    ents = [(b".", p.inode), (b"..", p.parent), *_entries(p.inode).items()]
    ents.sort(key=lambda e: e[0])
    return ents


def _dir_blocks(names: list[bytes]) -> list[tuple[int, int, int]]:
    """Split sorted names into directory blocks: (first index, count, used bytes)."""
    blocks, start, used = [], 0, 0
    for i, name in enumerate(names):
        if used + L.DIRENT.size + len(name) > L.BLOCK:
            blocks.append((start, i - start, used))
            start, used = i, 0
        used += L.DIRENT.size + len(name)
    blocks.append((start, len(names) - start, used))
    return blocks


def _walk(root: Inode) -> list[_Placed]:
    """Inodes in the order they are written: a directory, then its non-directory
    children (so a package's files sit next to each other), then its subdirectories."""
    placed: dict[int, _Placed] = {}
    order: list[_Placed] = []

    def place(inode: Inode, parent: Inode) -> _Placed:
        p = placed.get(id(inode))
        if p is not None:
            if stat.S_ISDIR(inode.fmt):
                raise ImageError("a directory appears twice in the tree")
            p.nlink += 1
            return p
        p = placed[id(inode)] = _Placed(inode, parent, ino=len(order) + 1)
        order.append(p)
        return p

    stack = [(root, root)]
    place(root, root)
    while stack:
        d, parent = stack.pop()
        pd = placed[id(d)]
        pd.nlink = 2
        subdirs = []
        for name, child in sorted(_entries(d).items()):
            if name in (b".", b"..") or not name or b"/" in name or b"\0" in name:
                raise ImageError(f"invalid name {name!r} in the tree")
            if len(name) > 255:
                raise ImageError(f"name longer than 255 bytes: {name[:40]!r}...")
            if stat.S_ISDIR(child.fmt):
                if child.entries is None:
                    raise ImageError(f"directory {name!r} has no entry list")
                subdirs.append(child)
                pd.nlink += 1
            else:
                place(child, d)
        for child in subdirs:
            place(child, d)
        stack.extend((c, d) for c in reversed(subdirs))
    return order


def write_image(root: Inode, *, chunk_size: int, blob_blocks: int,
                tag: bytes = b"") -> tuple[bytes, ImageStats]:
    """The metadata image of ``root`` (a directory Inode) whose chunks live in a blob of
    ``blob_blocks`` 4 KiB blocks. ``tag`` names the blob in the device slot."""
    if chunk_size < L.BLOCK or chunk_size & (chunk_size - 1):
        raise ImageError(f"chunk size {chunk_size} is not a power of two >= {L.BLOCK}")
    chunk_bits = chunk_size.bit_length() - 1 - L.BLOCK_BITS
    if chunk_bits > L.CHUNK_FORMAT_BLKBITS_MASK:
        raise ImageError(f"chunk size {chunk_size} is too large for EROFS")
    if not stat.S_ISDIR(root.fmt) or root.entries is None:
        raise ImageError("the root must be a directory")
    stats = ImageStats()
    order = _walk(root)
    stats.inodes = len(order)

    # pass 1: where every inode goes, and how big its data is (names only, no nids yet)
    pos = L.BLOCK
    for p in order:
        ino = p.inode
        p.xattr_body = _xattr_body(ino.xattrs, stats)
        fixed = L.INODE.size + len(p.xattr_body)
        meta = fixed
        if stat.S_ISREG(ino.fmt) and ino.size > 0:
            nchunks = math.ceil(ino.size / chunk_size)
            if ino.chunk_blocks is None or len(ino.chunk_blocks) != nchunks:
                raise ImageError(f"a file of {ino.size} bytes needs {nchunks} chunks, "
                                 f"got {len(ino.chunk_blocks or ())}")
            p.layout = L.LAYOUT_CHUNK_BASED
            meta = _align(fixed, L.CHUNK_INDEX.size) + nchunks * L.CHUNK_INDEX.size
        elif stat.S_ISDIR(ino.fmt) or stat.S_ISLNK(ino.fmt):
            if stat.S_ISDIR(ino.fmt):
                blocks = _dir_blocks([n for n, _ in _dirents(p)])
                p.data_size = (len(blocks) - 1) * L.BLOCK + blocks[-1][2]
            else:
                p.data_size = len(ino.target)
            tail_size = p.data_size % L.BLOCK
            if tail_size and fixed + tail_size <= L.BLOCK:
                if pos % L.BLOCK + fixed + tail_size > L.BLOCK:
                    pos = _align(pos, L.BLOCK)   # the tail may not cross a block
                p.layout = L.LAYOUT_FLAT_INLINE
                p.data_blocks = p.data_size // L.BLOCK
                meta = fixed + tail_size
            else:
                p.data_blocks = L.blocks_for(p.data_size)
        p.nid = pos // L.ISLOT
        pos = _align(pos + meta, L.ISLOT)
    if order[0].nid > 0xFFFF:
        raise ImageError("root inode does not fit a 16-bit nid")
    blk = L.blocks_for(pos)
    for p in order:
        if p.data_blocks:
            p.blkaddr, blk = blk, blk + p.data_blocks
    stats.blocks = blk
    image = bytearray(blk * L.BLOCK)

    # pass 2: the bytes
    nid_of = {id(p.inode): p.nid for p in order}
    for p in order:
        ino = p.inode
        at = p.nid * L.ISLOT
        if p.layout == L.LAYOUT_CHUNK_BASED:
            i_u = L.CHUNK_FORMAT_INDEXES | chunk_bits
        elif stat.S_ISCHR(ino.fmt) or stat.S_ISBLK(ino.fmt):
            i_u = L.new_encode_dev(ino.rdev)
        else:
            i_u = p.blkaddr
        size = p.data_size if (stat.S_ISDIR(ino.fmt) or stat.S_ISLNK(ino.fmt)) else (
            ino.size if stat.S_ISREG(ino.fmt) else 0)
        mtime = max(ino.mtime, 0.0)
        sec = int(mtime)
        nsec = min(int(round((mtime - sec) * 1e9)), 999_999_999)
        icount = (len(p.xattr_body) - L.XATTR_IBODY_HEADER.size) // 4 + 1 if p.xattr_body else 0
        image[at:at + L.INODE.size] = L.INODE.pack(
            L.INODE_EXTENDED | (p.layout << 1), icount, (ino.fmt | (ino.mode & 0o7777)), 0,
            size, i_u, p.ino & 0xFFFFFFFF, ino.uid, ino.gid, sec, nsec, p.nlink, b"")
        at += L.INODE.size
        image[at:at + len(p.xattr_body)] = p.xattr_body
        at += len(p.xattr_body)
        if p.layout == L.LAYOUT_CHUNK_BASED:
            at = _align(at, L.CHUNK_INDEX.size)
            assert ino.chunk_blocks is not None   # pass 1 chose this layout for them
            for b in ino.chunk_blocks:
                image[at:at + 8] = L.CHUNK_INDEX.pack(b >> 32, 1, b & 0xFFFFFFFF)
                at += 8
            continue
        if stat.S_ISDIR(ino.fmt):
            data = _dir_data(p, nid_of)
        elif stat.S_ISLNK(ino.fmt):
            data = ino.target
        else:
            continue
        full = p.data_blocks * L.BLOCK
        if p.layout == L.LAYOUT_FLAT_INLINE:
            tail = data[full:]
            image[at:at + len(tail)] = tail
            data = data[:full]
        d0 = p.blkaddr * L.BLOCK
        image[d0:d0 + len(data)] = data

    uuid = hashlib.sha256(b"bootseer.erofs\0" + tag).digest()[:16]
    slot_off = L.SUPER_OFFSET + L.SUPER.size
    image[L.SUPER_OFFSET:slot_off] = L.SUPER.pack(
        L.MAGIC, 0, 0, L.BLOCK_BITS, 0, order[0].nid, len(order), 0, 0, blk, 0, 0, uuid,
        b"bootseer".ljust(16, b"\0"), L.INCOMPAT_CHUNKED_FILE | L.INCOMPAT_DEVICE_TABLE, 0,
        1, slot_off // L.DEVICE_SLOT.size, 0, 0, 0, 0, 0, 0, b"", 0, 0, 0)
    image[slot_off:slot_off + L.DEVICE_SLOT.size] = L.DEVICE_SLOT.pack(
        tag[:64], blob_blocks & 0xFFFFFFFF, 0, blob_blocks >> 32, 0, b"")
    return bytes(image), stats


def _dir_data(p: _Placed, nid_of: dict[int, int]) -> bytes:
    ents = _dirents(p)
    out = bytearray()
    for start, count, used in _dir_blocks([n for n, _ in ents]):
        block = ents[start:start + count]
        nameoff = count * L.DIRENT.size
        heads, names = [], []
        for name, child in block:
            heads.append(L.DIRENT.pack(nid_of[id(child)], nameoff,
                                       L.FILE_TYPE.get(stat.S_IFMT(child.fmt), 0), 0))
            names.append(name)
            nameoff += len(name)
        body = b"".join(heads) + b"".join(names)
        assert len(body) == used
        if start + count < len(ents):
            body += b"\0" * (L.BLOCK - len(body))   # every block but the last is whole
        out += body
    return bytes(out)
