"""Ordinary overlayfs snapshots, laid out as containerd's own overlay snapshotter lays them
out, so any image works: ``ROOT/snapshots/<id>/fs`` holds a snapshot's files (the upper
directory while it is active, a lower directory once committed) and ``work`` overlayfs's
work directory.

Mounts, by the snapshot's parents (nearest first):
- none: a bind mount of its own ``fs`` (overlayfs needs at least one lower directory);
- active: overlay, ``lowerdir`` the parents' ``fs``, ``upperdir``/``workdir`` its own;
- view of one parent: a read-only bind of that parent's ``fs``; of several: a read-only
  overlay of them.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from bootseer.snapshotter.metadata import ACTIVE, VIEW, Snapshot


@dataclass(frozen=True, slots=True)
class Mount:
    type: str
    source: str
    options: list[str]


class OverlayLayout:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.snapshots = os.path.join(self.root, "snapshots")
        os.makedirs(self.snapshots, mode=0o700, exist_ok=True)

    def dir(self, s: Snapshot | int) -> str:
        return os.path.join(self.snapshots, str(s if isinstance(s, int) else s.id))

    def fs(self, s: Snapshot | int) -> str:
        return os.path.join(self.dir(s), "fs")

    def create(self, s: Snapshot) -> None:
        """Directories for a new snapshot, made beside and renamed in: a crash leaves a
        ``new-*`` directory that :meth:`cleanup` removes, never a half-made snapshot."""
        tmp = os.path.join(self.snapshots, f"new-{s.id}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.join(tmp, "fs"), mode=0o755)
        if s.kind == ACTIVE:
            os.mkdir(os.path.join(tmp, "work"), 0o711)
        os.rename(tmp, self.dir(s))

    def mounts(self, s: Snapshot, parents: list[Snapshot]) -> list[Mount]:
        if not parents:
            mode = "ro" if s.kind == VIEW else "rw"
            return [Mount("bind", self.fs(s), [mode, "rbind"])]
        lower = "lowerdir=" + ":".join(self.fs(p) for p in parents)
        if s.kind == ACTIVE:
            return [Mount("overlay", "overlay",
                          ["index=off", f"workdir={os.path.join(self.dir(s), 'work')}",
                           f"upperdir={self.fs(s)}", lower])]
        if len(parents) == 1:
            return [Mount("bind", self.fs(parents[0]), ["ro", "rbind"])]
        return [Mount("overlay", "overlay", ["index=off", "ro", lower])]

    def usage(self, s: Snapshot) -> tuple[int, int]:
        """(bytes, inodes) this snapshot's own directory holds (hard links counted once)."""
        size, inodes, seen = 0, 0, set()
        for top, dirs, files in os.walk(self.fs(s)):
            for name in dirs + files:
                st = os.lstat(os.path.join(top, name))
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                inodes += 1
                size += st.st_blocks * 512
        return size, inodes

    def in_use(self, s: Snapshot, *, own_mount: bool = False) -> str | None:
        """The mount that still uses this snapshot's directory (an overlay naming it as
        upper or lower directory, or a mount below it), else None. ``own_mount``: the
        snapshot's ``fs`` is itself a mount the snapshotter made (a lazy tree): not a user."""
        path = self.fs(s)
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 4:
                    continue
                target = fields[1].replace("\\040", " ")
                options = fields[3].split(",")
                if (target == path and not own_mount) or target.startswith(path + "/") or any(
                        path in o.partition("=")[2].split(":") for o in options
                        if o.startswith(("upperdir=", "lowerdir="))):
                    return target
        return None

    def remove(self, s: Snapshot) -> None:
        """Renamed aside first (one step), then deleted: a crash in between leaves a
        ``rm-*`` directory for :meth:`cleanup`."""
        gone = os.path.join(self.snapshots, f"rm-{s.id}")
        try:
            os.rename(self.dir(s), gone)
        except FileNotFoundError:
            return
        shutil.rmtree(gone, ignore_errors=True)

    def cleanup(self, known_ids: set[int]) -> list[str]:
        """Remove directories no record names (crashed creates and removes). Only names
        this layout makes (``<id>``, ``new-<id>``, ``rm-<id>``) are touched."""
        removed = []
        for name in os.listdir(self.snapshots):
            base = name.removeprefix("new-").removeprefix("rm-")
            if not base.isdigit():
                continue   # not ours: leave it
            if name == base and int(base) in known_ids:
                continue
            shutil.rmtree(os.path.join(self.snapshots, name), ignore_errors=True)
            removed.append(name)
        return removed
