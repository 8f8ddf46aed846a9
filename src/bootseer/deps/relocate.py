"""Prefix occurrences: recorded when a snapshot is taken, rewritten when it is restored at
another prefix.

Every node normally uses the same prefix, so nothing needs this. When a snapshot built at
``/envs/a`` is wanted at ``/envs/b`` (same pins, same interpreter), the text files that
name the old prefix (script shebangs, ``activate*``, ``pyvenv.cfg``, ``RECORD``) and
absolute symlinks into it are rewritten. A binary file that embeds the prefix (an RPATH, a
compiled-in path) cannot be rewritten safely: such a snapshot is refused for relocation
and the environment is built at the new prefix instead (conda-pack and venv-pack fail
later, at import; we fail before restoring). ``.pyc`` files are skipped: importlib
replaces the recorded ``co_filename`` with the real source path when it loads them.
"""

from __future__ import annotations

import os
import re

from bootseer.deps.resolve import DepsError

IGNORED_SUFFIXES = (".pyc",)


def _pattern(prefix: str) -> re.Pattern[bytes]:
    # "/envs/train" must not match inside "/envs/training"
    return re.compile(re.escape(prefix.rstrip("/").encode()) + rb"(?![\w.-])")


def scan(root: str, prefix: str) -> dict:
    """Files under ``root`` (the environment at ``prefix``) that name ``prefix``:
    ``{"text": [...], "binary": [...], "links": [...]}``, paths relative to root."""
    pat = _pattern(prefix)
    found: dict[str, list[str]] = {"text": [], "binary": [], "links": []}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                if pat.search(os.readlink(path).encode()):
                    found["links"].append(rel)
                continue
            if name.endswith(IGNORED_SUFFIXES) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            if pat.search(data):
                found["binary" if b"\0" in data else "text"].append(rel)
    for v in found.values():
        v.sort()
    return found


def check(record: dict | None, old: str, new: str) -> None:
    """Raise DepsError when a snapshot made at ``old`` cannot be used at ``new``."""
    if old.rstrip("/") == new.rstrip("/"):
        return
    if record is None:
        raise DepsError(f"the snapshot was made at {old} and recorded no prefix occurrences: "
                        f"it cannot be relocated to {new}")
    if record.get("binary"):
        shown = ", ".join(record["binary"][:3])
        raise DepsError(f"the snapshot made at {old} embeds that path in binary files "
                        f"({shown}{', ...' if len(record['binary']) > 3 else ''}), which "
                        f"cannot be rewritten for {new}")


def rewrite_bytes(data: bytes, old: str, new: str) -> bytes:
    return _pattern(old).sub(new.rstrip("/").encode().replace(b"\\", b"\\\\"), data)


def rewrite(root: str, record: dict, old: str, new: str) -> int:
    """Rewrite the recorded occurrences in the environment extracted at ``root`` (it will
    live at ``new``); keep each file's mode. Returns the number of paths changed."""
    check(record, old, new)
    n = 0
    for rel in record.get("text", []):
        path = os.path.join(root, rel)
        mode = os.stat(path).st_mode & 0o7777
        with open(path, "rb") as f:
            data = f.read()
        os.chmod(path, mode | 0o200)
        with open(path, "wb") as f:
            f.write(rewrite_bytes(data, old, new))
        os.chmod(path, mode)
        n += 1
    for rel in record.get("links", []):
        path = os.path.join(root, rel)
        target = rewrite_bytes(os.readlink(path).encode(), old, new).decode()
        parent = os.path.dirname(path)
        pmode = os.stat(parent).st_mode & 0o7777
        os.chmod(parent, pmode | 0o200)
        os.unlink(path)
        os.symlink(target, path)
        os.chmod(parent, pmode)
        n += 1
    return n
