"""Paths resolved inside a container root, as the container will see them.

A container root (usually a lazy image) is not the host: ``..`` at its top stays at its
top, an absolute symlink means the root's ``/``, and a relative one may not climb out. The
host's resolver (``os.path.realpath``, ``Path.exists``) does none of that, so a check of
``../../bin/ls`` or of a link to ``/etc/shadow`` would look at the host's files.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from pathlib import Path

MAX_LINKS = 40   # as the kernel's ELOOP limit
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def resolve(root: str | os.PathLike, path: str) -> Path | None:
    """The host path of ``path`` (relative paths start at the root too) resolved as if
    ``root`` were ``/`` (chroot-style: ``..`` clamped at the root, symlinks followed inside
    it); None when a component is missing, not a directory, or links loop."""
    root = Path(root)
    todo = deque(_parts(path))
    done: list[str] = []   # resolved components, each a real directory below root (or last)
    links = 0
    while todo:
        part = todo.popleft()
        if part == "..":
            if done:
                done.pop()
            continue
        host = root.joinpath(*done, part)
        try:
            st = os.lstat(host)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                return None
            target = os.readlink(host)
            if target.startswith("/"):
                done = []
            todo.extendleft(reversed(_parts(target)))
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            return None
        done.append(part)
    return root.joinpath(*done)


def has_command(rootfs: str | os.PathLike, argv0: str, path: str = DEFAULT_PATH,
                workdir: str = "/") -> bool:
    """Whether ``argv0`` names a command inside ``rootfs`` (with a ``/``: that path, from
    ``workdir`` when relative; else a ``PATH`` entry that has it): checked before starting,
    so a command missing from the image is a clear error with exit status 127."""
    if "/" in argv0:
        candidates = [argv0 if argv0.startswith("/") else f"{workdir}/{argv0}"]
    else:
        candidates = [f"{d}/{argv0}" for d in path.split(":") if d]
    for candidate in candidates:
        found = resolve(rootfs, candidate)
        if found is not None and not found.is_dir():
            return True
    return False
