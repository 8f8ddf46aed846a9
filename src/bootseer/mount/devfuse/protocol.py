"""The FUSE wire protocol, as far as a read-only server needs it.

Layouts follow the kernel's ``include/uapi/linux/fuse.h`` (protocol 7.40 answered; the
kernel offers 7.45 here). Little-endian, native alignment: every struct is padded to 8
bytes by the kernel's own definition, so ``struct`` formats with ``<`` match exactly.
"""

from __future__ import annotations

import stat
import struct

from bootseer.mount.view import Attr

KERNEL_VERSION = 7
ANSWERED_MINOR = 40
"""7.40 added FOPEN_PASSTHROUGH, backing ids and ``max_stack_depth``; nothing later is used."""

# opcodes (enum fuse_opcode)
LOOKUP, FORGET, GETATTR, SETATTR, READLINK = 1, 2, 3, 4, 5
OPEN, READ, WRITE, STATFS, RELEASE = 14, 15, 16, 17, 18
GETXATTR, LISTXATTR, FLUSH, INIT = 22, 23, 25, 26
OPENDIR, READDIR, RELEASEDIR = 27, 28, 29
ACCESS, INTERRUPT, DESTROY, IOCTL, BATCH_FORGET = 34, 36, 38, 39, 42
NO_REPLY = frozenset({FORGET, BATCH_FORGET, INTERRUPT})
"""Requests the kernel expects no answer to."""
NAMES = {LOOKUP: "lookup", FORGET: "forget", GETATTR: "getattr", SETATTR: "setattr",
         READLINK: "readlink", OPEN: "open", READ: "read", WRITE: "write", STATFS: "statfs",
         RELEASE: "release", GETXATTR: "getxattr", LISTXATTR: "listxattr", FLUSH: "flush",
         INIT: "init", OPENDIR: "opendir", READDIR: "readdir", RELEASEDIR: "releasedir",
         ACCESS: "access", INTERRUPT: "interrupt", DESTROY: "destroy", IOCTL: "ioctl",
         BATCH_FORGET: "batch_forget"}

# INIT flags (flags; bits 32..63 travel in flags2)
ASYNC_READ = 1 << 0
BIG_WRITES = 1 << 5
PARALLEL_DIROPS = 1 << 18
MAX_PAGES = 1 << 22
CACHE_SYMLINKS = 1 << 23
INIT_EXT = 1 << 30
PASSTHROUGH = 1 << 37

# OPEN reply flags
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_CACHE_DIR = 1 << 3
FOPEN_NOFLUSH = 1 << 5
"""No FLUSH on close (nothing to flush read-only): one round trip less per file, and a file
held across an unmount closes without ENOTCONN."""
FOPEN_PASSTHROUGH = 1 << 7
"""Never together with FOPEN_KEEP_CACHE: the kernel then fails every read with EIO."""

# /dev/fuse ioctls: _IOW(229, 1, struct fuse_backing_map), _IOW(229, 2, uint32_t)
DEV_IOC_BACKING_OPEN = 0x4010E501
DEV_IOC_BACKING_CLOSE = 0x4004E502

IN_HEADER = struct.Struct("<IIQQIIIHH")      # len opcode unique nodeid uid gid pid extlen pad
OUT_HEADER = struct.Struct("<IiQ")            # len error unique
INIT_IN = struct.Struct("<IIIII")             # major minor max_readahead flags flags2
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # ... flags2 max_stack_depth unused[6]
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")     # fuse_attr, 88 bytes
ENTRY_OUT = struct.Struct("<QQQQII")          # nodeid generation entry/attr valid + nsec
ATTR_OUT = struct.Struct("<QII")              # attr_valid attr_valid_nsec dummy
OPEN_IN = struct.Struct("<II")                # flags open_flags
OPEN_OUT = struct.Struct("<QIi")              # fh open_flags backing_id
READ_IN = struct.Struct("<QQII")              # fh offset size read_flags (then lock_owner..)
RELEASE_IN = struct.Struct("<QIIQ")           # fh flags release_flags lock_owner
GETXATTR_IN = struct.Struct("<II")            # size padding
GETXATTR_OUT = struct.Struct("<II")           # size padding
KSTATFS = struct.Struct("<QQQQQIIII24x")      # fuse_kstatfs, 80 bytes
DIRENT = struct.Struct("<QQII")               # ino off namelen type, then the name
BACKING_MAP = struct.Struct("<iIQ")           # fd flags padding

assert (ATTR.size, INIT_OUT.size, KSTATFS.size, IN_HEADER.size) == (88, 64, 80, 40)


def attr_bytes(a: Attr, ino: int) -> bytes:
    """``struct fuse_attr`` of ``a``; ``ino`` is the node id (stable for the mount)."""
    sec = int(a.mtime)
    nsec = int((a.mtime - sec) * 1e9)
    return ATTR.pack(ino, a.size, (a.size + 511) // 512, sec, sec, sec, nsec, nsec, nsec,
                     a.mode, a.nlink, a.uid, a.gid, a.rdev, a.blksize, 0)


def entry_bytes(nodeid: int, a: Attr | None, timeout: int) -> bytes:
    """``fuse_entry_out``; node id 0 with no attributes is a cached negative entry."""
    head = ENTRY_OUT.pack(nodeid, 0, timeout, timeout, 0, 0)
    return head + (attr_bytes(a, nodeid) if a is not None else bytes(ATTR.size))


def dirent_bytes(ino: int, next_offset: int, name: bytes, mode: int = 0) -> bytes:
    """One ``fuse_dirent``, padded to 8 bytes; ``mode`` 0 gives DT_UNKNOWN."""
    raw = DIRENT.pack(ino, next_offset, len(name), stat.S_IFMT(mode) >> 12) + name
    return raw + bytes(-len(raw) % 8)
