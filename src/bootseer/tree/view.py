"""A TreeReader as a mount view (see bootseer.mount)."""

from __future__ import annotations

import base64

from bootseer.mount.view import Attr
from bootseer.tree.reader import TreeReader


class TreeMountView:
    def __init__(self, reader: TreeReader, on_close=None):
        self.reader, self._on_close = reader, on_close
        self._nlink: dict[str, int] = {}
        for e in reader.entries.values():
            if e.type == "h" and e.target is not None:
                self._nlink[e.target] = self._nlink.get(e.target, 1) + 1

    def getattr(self, path: str) -> Attr:
        e = self.reader.entry(path)
        raw = self.reader.entries[path]   # a link's count is its file's, by either name
        nlink = 2 if e.type == "d" else self._nlink.get(
            raw.target if raw.type == "h" and raw.target else path, 1)
        return Attr(mode=self.reader.mode(e), size=e.size, uid=e.uid, gid=e.gid,
                    mtime=e.mtime, nlink=nlink, rdev=e.rdev or 0)

    def readdir(self, path: str) -> list[str]:
        e = self.reader.entry(path)
        if e.type != "d":
            raise NotADirectoryError(path)
        return sorted(self.reader.children.get(path, []))

    def readlink(self, path: str) -> str:
        e = self.reader.entry(path)
        if e.type != "l" or e.target is None:
            raise OSError(22, "not a symlink", path)
        return e.target

    def read(self, path: str, size: int, offset: int) -> bytes:
        return self.reader.read(path, size, offset)

    def listxattr(self, path: str) -> list[str]:
        return list(self.reader.entry(path).xattrs or {})

    def getxattr(self, path: str, name: str) -> bytes | None:
        v = (self.reader.entry(path).xattrs or {}).get(name)
        return None if v is None else base64.b64decode(v)

    def statfs(self) -> dict:
        total = self.reader.total_bytes()
        return {"f_bsize": 1 << 20, "f_frsize": 4096, "f_blocks": total // 4096 + 1,
                "f_bfree": 0, "f_bavail": 0, "f_files": len(self.reader.entries),
                "f_ffree": 0, "f_namemax": 255}

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
