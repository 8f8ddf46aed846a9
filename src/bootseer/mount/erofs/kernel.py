"""EROFS mounts through ``mount(2)`` itself: util-linux ``mount -t erofs FILE`` attaches a
loop device without saying so, while the syscall on a regular file uses the kernel's
file-backed mode (``CONFIG_EROFS_FS_BACKED_BY_FILE``), with the blob named by
``device=<file>``. And the feature check: the filesystem is registered and a probe image
written by this package mounts and reads back."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import stat
import tempfile
import threading

from bootseer.errors import MountError
from bootseer.mount.erofs.layout import BLOCK
from bootseer.mount.erofs.writer import Inode, write_image
from bootseer.node import mounts
from bootseer.node.libc import libc

log = logging.getLogger(__name__)


class ErofsMountError(MountError):
    pass


def mount(image: str, mountpoint: str, blob: str, extra: str = "") -> None:
    """Mount the metadata ``image`` at ``mountpoint`` with ``blob`` as its device 1
    (read-only, nosuid, nodev)."""
    for what, path in (("image", image), ("blob", blob)):
        if "," in path:   # the option string cannot quote a comma
            raise ErofsMountError(f"the EROFS {what} path {path} contains a comma")
    opts = f"device={os.path.abspath(blob)}" + (f",{extra}" if extra else "")
    try:
        mounts.mount(os.path.abspath(image), mountpoint, "erofs",
                     mounts.MS_RDONLY | mounts.MS_NOSUID | mounts.MS_NODEV, opts)
    except MountError as e:
        raise ErofsMountError(f"cannot mount EROFS image {image} at {mountpoint}: "
                              f"{os.strerror(e.errno or 0)} (see dmesg)") from None


_bdi_lock = threading.Lock()
READ_AHEAD_KB = 1024
# The read-ahead of a mount whose server records the start (EROFS on a FUSE-served blob,
# the FUSE tree view): what the kernel reads ahead reaches the server as the start's own
# reads and is recorded into the hot set, so it is the kernel's default, which a local
# image's start runs with (at 1 MiB a page fault of a shared object read 1 MiB around
# it: the neighbour chunk became hot).
START_READ_AHEAD_KB = 128


def _erofs_bdis() -> set[str]:
    try:
        return {n for n in os.listdir("/sys/class/bdi") if n.startswith("erofs-")}
    except OSError:
        return set()


def mount_with_read_ahead(image: str, mountpoint: str, blob: str, *, directio: bool = False,
                          read_ahead_kb: int = READ_AHEAD_KB) -> None:
    """:func:`mount`, then set the new mount's read-ahead (``READ_AHEAD_KB`` by default): EROFS
    reads ahead within a file only, so large files reach the blob in large reads. Each
    mount has its own ``/sys/class/bdi/erofs-<n>``, found as the one that appeared (an
    EROFS mount by another process at the same instant gets the same setting).
    ``directio``: EROFS reads the blob with O_DIRECT (no page cache of the blob itself,
    requests the size EROFS asks for)."""
    with _bdi_lock:
        before = _erofs_bdis()
        mount(image, mountpoint, blob, "directio" if directio else "")
        new = _erofs_bdis() - before
    for name in new:
        try:
            with open(f"/sys/class/bdi/{name}/read_ahead_kb", "w") as f:
                f.write(str(read_ahead_kb))
        except OSError as e:
            log.info("cannot raise the read-ahead of %s: %s", name, e)


# filesystems whose files EROFS cannot be mounted from (no ->read_folio: mount(2) says
# ENOTBLK); a blob there works, the metadata image does not
_NO_READ_FOLIO = {0x01021994: "tmpfs", 0x858458F6: "ramfs"}


def image_fs_problem(directory: str) -> str | None:
    """Why a metadata image in ``directory`` cannot be mounted (None: it can)."""
    buf = ctypes.create_string_buffer(256)   # struct statfs; f_type comes first
    if libc.statfs(os.fsencode(directory), buf) != 0:
        return f"cannot statfs {directory}: {os.strerror(ctypes.get_errno())}"
    f_type = int.from_bytes(buf.raw[:ctypes.sizeof(ctypes.c_long)], "little")
    name = _NO_READ_FOLIO.get(f_type)
    return f"{directory} is on {name}, which EROFS cannot mount images from" if name else None


def registered() -> bool:
    try:
        with open("/proc/filesystems") as f:
            return any(line.split()[-1] == "erofs" for line in f if line.strip())
    except OSError:
        return False


@functools.cache
def availability() -> str | None:
    """None when file-backed EROFS with a blob device works here, else why not (checked
    once per process)."""
    if os.geteuid() != 0:
        return "mounting EROFS needs root"
    if not registered():
        return "the kernel has no EROFS (not in /proc/filesystems)"
    try:
        _probe()
    except (OSError, ValueError) as e:
        return f"a probe mount failed: {e}"
    return None


PROBE_BYTES = b"bootseer erofs probe\n"


def _probe() -> None:
    """Write a one-file image and its blob, mount them from regular files, read back."""
    with tempfile.TemporaryDirectory(prefix="bootseer-erofs-probe-") as d:
        f = Inode(stat.S_IFREG, 0o444, size=len(PROBE_BYTES), chunk_blocks=[0])
        root = Inode(stat.S_IFDIR, 0o755, entries={b"probe": f})
        image, _ = write_image(root, chunk_size=BLOCK, blob_blocks=1, tag=b"probe")
        with open(f"{d}/meta", "wb") as out:
            out.write(image)
        with open(f"{d}/blob", "wb") as out:
            out.write(PROBE_BYTES.ljust(BLOCK, b"\0"))
        os.mkdir(f"{d}/mnt")
        mount(f"{d}/meta", f"{d}/mnt", f"{d}/blob")
        try:
            with open(f"{d}/mnt/probe", "rb") as got:
                if got.read() != PROBE_BYTES:
                    raise ValueError("the probe file reads back wrong bytes")
        finally:
            mounts.unmount(f"{d}/mnt")
