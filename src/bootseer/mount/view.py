"""What a mount shows: the protocol every read-only tree implements."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Attr:
    mode: int
    """Including the S_IFMT type bits."""
    size: int
    uid: int = 0
    gid: int = 0
    mtime: float = 0.0
    nlink: int = 1
    ino: int = 0
    rdev: int = 0
    blksize: int = 1 << 20
    """``st_blksize``: the buffer a reader's ``open()`` fills per read (Python's, stdio's)."""

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class TreeView(Protocol):
    """Paths are absolute within the mount ("/a/b"). Errors: FileNotFoundError for absent
    paths, store errors for data that cannot be fetched or verified."""

    def getattr(self, path: str) -> Attr: ...

    def readdir(self, path: str) -> list[str]: ...

    def readlink(self, path: str) -> str: ...

    def read(self, path: str, size: int, offset: int) -> bytes: ...
