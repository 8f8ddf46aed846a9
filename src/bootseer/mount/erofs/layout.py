"""The on-disk EROFS structures this package writes, after the kernel's
``include/uapi``-style definitions in erofs-utils ``include/erofs_fs.h`` (all little
endian). Only what an uncompressed, chunk-indexed image with one extra device needs."""

from __future__ import annotations

import stat
import struct

BLOCK_BITS = 12
BLOCK = 1 << BLOCK_BITS
SUPER_OFFSET = 1024
MAGIC = 0xE0F5E1E2

INCOMPAT_CHUNKED_FILE = 0x04
INCOMPAT_DEVICE_TABLE = 0x08

# i_format: bit 0 the inode version, bits 1-3 the data layout
INODE_EXTENDED = 1
LAYOUT_FLAT_PLAIN = 0
LAYOUT_FLAT_INLINE = 2
LAYOUT_CHUNK_BASED = 4
CHUNK_FORMAT_INDEXES = 0x20      # 8-byte indexes that name a device
CHUNK_FORMAT_BLKBITS_MASK = 0x1F

ISLOT = 32                       # nid = byte offset of the inode / 32 (meta_blkaddr 0)

# superblock: magic, checksum, feature_compat, blkszbits, sb_extslots, root nid (16 bit),
# inos, epoch, fixed_nsec, blocks, meta_blkaddr, xattr_blkaddr, uuid, volume_name,
# feature_incompat, compression field, extra_devices, devt_slotoff, dirblkbits,
# xattr_prefix_count, xattr_prefix_start, packed_nid, xattr filter, ishare id, reserved,
# build_time, root nid (48-bit images), reserved
SUPER = struct.Struct("<IIIBBHQQIIII16s16sIHHHBBIQBB2sIQQ")
# device slot: tag, blocks, unified address (0: not flat-addressed), blocks/addr MSB
DEVICE_SLOT = struct.Struct("<64sIIHH52s")
# extended inode: format, xattr_icount, mode, i_nb, size, i_u, ino, uid, gid, mtime,
# mtime_nsec, nlink, reserved
INODE = struct.Struct("<HHHHQIIIIQII16s")
CHUNK_INDEX = struct.Struct("<HHI")   # startblk_hi, device_id, startblk_lo
DIRENT = struct.Struct("<QHBB")       # nid, nameoff, file_type, reserved
XATTR_IBODY_HEADER = struct.Struct("<IB7s")   # name filter, shared count, reserved
XATTR_ENTRY = struct.Struct("<BBH")           # name length, name index, value size

assert SUPER.size == 128 and DEVICE_SLOT.size == 128 and INODE.size == 64
assert CHUNK_INDEX.size == 8 and DIRENT.size == 12 and XATTR_IBODY_HEADER.size == 12

FILE_TYPE = {stat.S_IFREG: 1, stat.S_IFDIR: 2, stat.S_IFCHR: 3, stat.S_IFBLK: 4,
             stat.S_IFIFO: 5, stat.S_IFSOCK: 6, stat.S_IFLNK: 7}

# xattr name prefixes the kernel knows by index; the ACL ones are whole names
XATTR_PREFIXES = (("user.", 1), ("trusted.", 4), ("security.", 6))
XATTR_WHOLE_NAMES = {"system.posix_acl_access": 2, "system.posix_acl_default": 3}


def new_encode_dev(rdev: int) -> int:
    """A dev_t as the kernel's 32-bit on-disk encoding (``new_encode_dev``)."""
    import os
    major, minor = os.major(rdev), os.minor(rdev)
    return ((minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)) & 0xFFFFFFFF


def blocks_for(size: int) -> int:
    return (size + BLOCK - 1) >> BLOCK_BITS
