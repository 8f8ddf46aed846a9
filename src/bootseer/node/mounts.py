"""The node's mount table, read from ``/proc/self/mountinfo``, and lazy unmounts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

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


def table() -> list[MountEntry]:
    """Every mount visible to this process (an empty list when /proc cannot be read)."""
    try:
        with open("/proc/self/mountinfo", encoding="latin-1") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 2:
            continue
        out.append(MountEntry(int(fields[0]), fields[2], _unescape(fields[4]), rest[0],
                              _unescape(rest[1])))
    return out


def find(mountpoint: str) -> MountEntry | None:
    """The topmost mount at ``mountpoint`` (a path that is not a mount point: None)."""
    want = os.path.realpath(mountpoint)
    hits = [e for e in table() if e.mountpoint == want]
    return hits[-1] if hits else None


def lazy_unmount(mountpoint: str) -> bool:
    """Detach ``mountpoint`` (MNT_DETACH: open files keep working, the name goes now).
    FUSE mounts of another user need fusermount3; root uses umount."""
    r = subprocess.run(["umount", "-l", mountpoint], capture_output=True)
    if r.returncode != 0 and shutil.which("fusermount3"):
        r = subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)
    return r.returncode == 0


def unmount_under(path: str) -> None:
    """Lazily unmount every mount at or below ``path``, deepest first. (``umount -R`` on a
    directory that is not itself a mount point unmounts nothing: podman's storage leaves
    ``<root>/overlay`` bind-mounted on itself.)"""
    root = os.path.realpath(path)
    points = [e.mountpoint for e in table()   # stacked mounts appear once per layer
              if e.mountpoint == root or e.mountpoint.startswith(root + "/")]
    for mp in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], capture_output=True)
