"""Materialise a whole tree into a directory (environment restore, eager image pull):
every chunk fetched in parallel through the fetcher, verified, written in place (by the
one chunk writer, ``bootseer.tree.writer``).

The tree comes from the store and is untrusted: its TOC was checked when it was loaded
(``validate``), and every entry is still created relative to a descriptor of its parent
directory that this module created itself (``mkdir``/``open``/``symlink`` with
``dir_fd``, ``O_NOFOLLOW``, ``O_EXCL``), so no path can lead outside ``dest`` or through a
symlink of the tree. Set-id bits and privilege-granting xattrs are dropped unless asked for.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bootseer.tree.reader import TreeReader
from bootseer.tree.toc import ChunkRef, Entry
from bootseer.tree.writer import ChunkWriter

SETID = 0o6000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Step:
    """One entry to create: ``src`` is the entry whose data and attributes it gets (a
    hard link's file); ``action`` is ``d``, ``l``, ``file`` (write the data) or ``link``
    (a further name of a file already written)."""
    entry: Entry
    src: Entry
    action: str


def plan(entries: tuple[Entry, ...]) -> list[Step]:
    """The steps in depth-first order, parents before children. The first name of a
    hard-linked file in that order is written; the others (the file's own path included)
    are links to it. Device nodes and fifos are not restored."""
    by_path = {e.path: e for e in entries}
    first: set[str] = set()
    steps = []
    for e in sorted(entries, key=lambda e: e.path.split("/")):
        if e.type in ("f", "h"):
            target = e.target if e.type == "h" and e.target is not None else e.path
            steps.append(Step(e, by_path[target], "link" if target in first else "file"))
            first.add(target)
        elif e.type in ("d", "l"):
            steps.append(Step(e, e, e.type))
    return steps


def chunk_order(steps: list[Step]) -> list[ChunkRef]:
    """Every chunk write of the steps, in order."""
    return [ref for s in steps if s.action == "file" for ref in s.src.chunks or ()]


def _mode(e: Entry, *, keep_privileges: bool, readonly: bool) -> int:
    mode = e.mode & 0o7777
    if not keep_privileges:
        mode &= ~SETID
    if readonly and e.type != "d":
        mode &= ~0o222
    return mode


def _xattrs(e: Entry, keep_privileges: bool) -> Iterator[tuple[str, bytes]]:
    """Name and value of each xattr to restore: only ``user.*`` ones unless privileges
    are kept (``security.capability`` grants what a setuid bit does)."""
    for name, value in (e.xattrs or {}).items():
        if keep_privileges or name.startswith("user."):
            yield name, base64.b64decode(value)


class _Restore:
    """Creates the steps' entries under the directory open at ``root_fd``, each relative
    to a descriptor of its parent that it made itself."""

    def __init__(self, root_fd: int, writer: ChunkWriter, steps: list[Step], *, chown: bool,
                 readonly: bool, keep_privileges: bool):
        self.root_fd, self.writer, self.chown = root_fd, writer, chown
        self.keep_privileges = keep_privileges
        self.opts = dict(keep_privileges=keep_privileges, readonly=readonly)
        self.stack: list[tuple[str, int, Entry | None]] = [("/", root_fd, None)]   # open dirs
        self.linked: dict[str, tuple[int, int]] = {}   # written file -> (its fd, links left)
        self.links_left: dict[str, int] = {}
        for s in steps:
            if s.action == "link":
                self.links_left[s.src.path] = self.links_left.get(s.src.path, 0) + 1

    def run(self, steps: list[Step]) -> int:
        """Create every step's entry; returns the bytes of file data written."""
        total = 0
        for s in steps:
            path = s.entry.path
            if path == "/":
                self.stack[0] = ("/", self.root_fd, s.entry)
                continue
            parent, name = path.rsplit("/", 1)
            dir_fd = self._enter(parent or "/", path)
            if s.action == "d":
                os.mkdir(name, 0o700, dir_fd=dir_fd)
                self.stack.append((path, os.open(name, _DIR_FLAGS, dir_fd=dir_fd), s.entry))
            elif s.action == "l":
                os.symlink(s.entry.target or "", name, dir_fd=dir_fd)
                if self.chown:
                    os.chown(name, s.entry.uid, s.entry.gid, dir_fd=dir_fd,
                             follow_symlinks=False)
            elif s.action == "file":
                total += self._write_file(name, dir_fd, s.entry, s.src)
            else:
                self._link_file(name, dir_fd, s.src)
        while self.stack:
            self._close_dir(*self.stack.pop())
        return total

    def _enter(self, parent: str, path: str) -> int:
        """The descriptor of ``parent``, closing the directories finished before it."""
        while self.stack[-1][0] != parent:
            if len(self.stack) == 1:   # validate() makes this unreachable; never guess
                raise OSError(f"tree entry {path!r} has no directory to be created in")
            self._close_dir(*self.stack.pop())
        return self.stack[-1][1]

    def _attributes(self, fd: int, e: Entry) -> None:
        """Owner, then mode (chown clears set-id bits; may drop write), xattrs, times."""
        if self.chown:
            os.fchown(fd, e.uid, e.gid)
        os.fchmod(fd, _mode(e, **self.opts))
        for name, value in _xattrs(e, self.keep_privileges):
            try:
                os.setxattr(fd, name, value)
            except OSError:
                pass   # a filesystem without xattrs (or this namespace) restores without them
        os.utime(fd, (e.mtime, e.mtime))

    def _close_dir(self, path: str, fd: int, e: Entry | None) -> None:
        """Its entries are all made: now its attributes."""
        try:
            if e is not None:
                self._attributes(fd, e)
        finally:
            if fd != self.root_fd:
                os.close(fd)

    def _write_file(self, name: str, dir_fd: int, e: Entry, src: Entry) -> int:
        fd = os.open(name, _NEW_FILE, 0o600, dir_fd=dir_fd)
        written = 0
        try:
            csize = 0
            for ref in src.chunks or ():
                written += self.writer.write(fd, ref, csize, e.path)
                csize += ref.size
            self._attributes(fd, src)
        except BaseException:
            os.close(fd)
            raise
        if self.links_left.get(src.path):
            self.linked[src.path] = (fd, self.links_left[src.path])
        else:
            os.close(fd)
        return written

    def _link_file(self, name: str, dir_fd: int, src: Entry) -> None:
        fd, left = self.linked[src.path]
        # linkat of the open file itself: no path of the tree is resolved again
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
        if left > 1:
            self.linked[src.path] = (fd, left - 1)
        else:
            del self.linked[src.path]
            os.close(fd)

    def close(self) -> None:
        """Close what a failed restore left open."""
        for _, fd, _ in self.stack[1:]:
            os.close(fd)
        for fd, _ in self.linked.values():
            os.close(fd)


def extract(reader: TreeReader, dest: str | Path, *,
            progress: Callable[[int], None] | None = None, chown: bool | None = None,
            readonly: bool = False, timing: dict | None = None,
            keep_privileges: bool = False) -> int:
    """Write the tree under ``dest`` (which must not exist or be empty). Returns bytes.
    ``progress(bytes)`` is called as each distinct chunk is first written. ``timing``
    gets ``fetched_at`` (wall time the last fetched chunk arrived) and ``chunks`` (how
    many were fetched). ``keep_privileges`` restores set-id bits and
    ``security.*``/``trusted.*`` xattrs (never for an environment)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    chown = (os.geteuid() == 0) if chown is None else chown
    steps = plan(reader.toc.entries)
    with ChunkWriter(chunk_order(steps), reader=reader, progress=progress) as writer:
        try:
            root_fd = os.open(dest, _DIR_FLAGS)
            restore = _Restore(root_fd, writer, steps, chown=chown, readonly=readonly,
                               keep_privileges=keep_privileges)
            try:
                return restore.run(steps)
            finally:
                restore.close()
                os.close(root_fd)
        finally:
            if timing is not None:
                fetched = writer.fetched()
                timing["chunks"] = fetched.chunks
                if fetched.last_at is not None:
                    timing["fetched_at"] = fetched.last_at
