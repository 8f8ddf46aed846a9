"""The node's mounts: the mount table (``/proc/self/mountinfo``, parsed here only), the
``mount(2)`` call and the one unmount (``umount2(2)``, ``fusermount3`` for a FUSE mount
this process may not unmount itself)."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from bootseer.errors import MountError
from bootseer.node.libc import last_error, libc

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MNT_DETACH = 2
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True, slots=True)
class MountEntry:
    mount_id: int
    dev: str          # "major:minor"
    mountpoint: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as ``\\ooo``."""
    raw = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)
    return raw.encode("latin-1", "surrogateescape").decode("utf-8", "surrogateescape")


OWN_TABLE = "/proc/self/mountinfo"


def _read(mountinfo: str = OWN_TABLE) -> list[MountEntry] | None:
    """The mount table, or None when /proc cannot be read."""
    try:
        with open(mountinfo, encoding="latin-1") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 2:
            continue
        out.append(MountEntry(int(fields[0]), fields[2], _unescape(fields[4]), rest[0],
                              _unescape(rest[1])))
    return out


def table(mountinfo: str = OWN_TABLE) -> list[MountEntry]:
    """Every mount visible to this process (an empty list when /proc cannot be read);
    ``mountinfo``: another process's table (the node's, read by housekeeping in a pod)."""
    return _read(mountinfo) or []


def _canonical(path: str) -> str:
    """``path`` as the table writes it: absolute, its directory resolved, the last part
    not (a mount point that is a symlink's name is not followed)."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def find(mountpoint: str, mountinfo: str = OWN_TABLE) -> MountEntry | None:
    """The topmost mount at ``mountpoint`` (a path that is not a mount point: None)."""
    want = os.path.realpath(mountpoint)
    hits = [e for e in table(mountinfo) if e.mountpoint == want]
    return hits[-1] if hits else None


def is_mount_point(path: str, mountinfo: str = OWN_TABLE) -> bool:
    """Whether ``path`` is a mount point, read from the mount table: a FUSE mount whose
    server died fails every stat (ENOTCONN), which ``os.path.ismount`` takes for "no"."""
    entries = _read(mountinfo)
    if entries is None:
        return os.path.ismount(path)
    want = _canonical(path)
    return any(e.mountpoint == want for e in entries)


def _error(what: str) -> MountError:
    """The MountError for the call that just failed (``errno``, ``strerror`` set)."""
    e = last_error(what)
    return MountError(e.errno, e.strerror)


def mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    """``mount(2)``; raises MountError (``errno`` set) saying what failed."""
    if libc.mount(os.fsencode(source), os.fsencode(target), fstype.encode(), flags,
                  data.encode()) != 0:
        raise _error(f"mount {target}")


def _fusermount(mountpoint: str) -> bool:
    """Detach a FUSE mount through the set-uid helper (a user's own FUSE mount)."""
    if not shutil.which("fusermount3"):
        return False
    return subprocess.run(["fusermount3", "-u", "-z", mountpoint],
                          capture_output=True).returncode == 0


def unmount(mountpoint: str, *, detach: bool = False) -> bool:
    """The one unmount. Unmount ``mountpoint``; when it is busy (files still open), or
    with ``detach``, detach it instead: the name goes now, the kernel keeps the
    filesystem for the open files until the last one closes. Where this process may not
    call umount2 (a user's FUSE mount), ``fusermount3`` detaches it. Returns True when
    it went at once (or nothing was mounted there), False when detached. Raises
    MountError when it stays."""
    path = os.fsencode(mountpoint)
    if not detach:
        if libc.umount2(path, 0) == 0:
            return True
        if ctypes.get_errno() == errno.EINVAL and not is_mount_point(mountpoint):
            return True   # not mounted (any more)
    if libc.umount2(path, MNT_DETACH) == 0:
        return False
    e = _error(f"cannot unmount {mountpoint}")
    if e.errno == errno.EINVAL and not is_mount_point(mountpoint):
        return True
    if _fusermount(mountpoint):
        return False
    raise e


def lazy_unmount(mountpoint: str) -> bool:
    """Detach ``mountpoint`` (open files keep working, the name goes now); whether it
    is gone."""
    try:
        unmount(mountpoint, detach=True)
    except MountError:
        return False
    return True


def unmount_under(path: str) -> None:
    """Detach every mount at or below ``path``, deepest first. (A directory that is not
    itself a mount point has nothing to unmount recursively: podman's storage leaves
    ``<root>/overlay`` bind-mounted on itself.)"""
    root = os.path.realpath(path)
    points = [e.mountpoint for e in table()   # stacked mounts appear once per layer
              if e.mountpoint == root or e.mountpoint.startswith(root + "/")]
    for mp in sorted(points, key=len, reverse=True):
        lazy_unmount(mp)
