"""A TOC comes from the store, which is untrusted: every TOC is checked when it is loaded,
before any entry is mounted or restored, and a tree that breaks a rule is refused whole,
with one line naming the offending path.

Rules: paths are canonical and absolute inside the tree (``/`` then components that are not
empty, ``.`` or ``..``, no NUL), each appears once, and every entry's parent is a directory
entry of the tree (so nothing lies under a symlink or a file); a hard link names a regular
file of the tree; a file's chunk list covers exactly its size in fixed-size chunks of known
packs. Restore then creates entries relative to directory descriptors it opened itself
(``extract``), so even a rule missed here cannot lead it through a symlink.
"""

from __future__ import annotations

import re

from bootseer.tree.format import TreeFormatError

TYPES = frozenset("fdlhcbp")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def path_problem(path: object) -> str | None:
    """Why ``path`` is not a canonical in-tree path, or None when it is."""
    if not isinstance(path, str):
        return "is not a string"
    if "\0" in path:
        return "contains a NUL byte"
    if not path.startswith("/"):
        return "is not absolute within the tree"
    if path == "/":
        return None
    for part in path[1:].split("/"):
        if part == "":
            return "has an empty component"
        if part in (".", ".."):
            return f"has a {part!r} component"
    return None


def _nonneg_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check(toc: dict, digest: str = "") -> None:
    """Raise TreeFormatError unless every entry of ``toc`` keeps to the rules."""
    name = f"tree {digest[:19]}" if digest else "tree"

    def refuse(path: object, why: str) -> TreeFormatError:
        return TreeFormatError(f"{name} is refused: entry {path!r} {why}")

    entries = toc.get("entries")
    packs = toc.get("packs")
    csize = toc.get("chunk_size")
    if not isinstance(entries, list) or not isinstance(packs, list) or not (
            _nonneg_int(csize) and csize > 0):
        raise TreeFormatError(f"{name} is refused: its TOC lacks entries, packs or chunk_size")
    for p in packs:
        if not isinstance(p, str) or not _DIGEST.fullmatch(p):
            raise TreeFormatError(f"{name} is refused: pack {p!r} is not a sha256 digest")
    by_path: dict[str, dict] = {}
    for e in entries:
        if not isinstance(e, dict):
            raise TreeFormatError(f"{name} is refused: an entry is not an object")
        path = e.get("path")
        why = path_problem(path)
        if why:
            raise refuse(path, why)
        if path in by_path:
            raise refuse(path, "appears twice")
        if e.get("type") not in TYPES:
            raise refuse(path, f"has unknown type {e.get('type')!r}")
        for field in ("mode", "uid", "gid", "size"):
            if not _nonneg_int(e.get(field)):
                raise refuse(path, f"has an invalid {field} {e.get(field)!r}")
        if e["mode"] > 0o7777:
            raise refuse(path, f"has mode bits beyond 0o7777 ({e['mode']:#o})")
        if not isinstance(e.get("mtime"), (int, float)) or isinstance(e.get("mtime"), bool):
            raise refuse(path, f"has an invalid mtime {e.get('mtime')!r}")
        xattrs = e.get("xattrs", {})
        if not isinstance(xattrs, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in xattrs.items()):
            raise refuse(path, "has malformed xattrs")
        by_path[path] = e
    if "/" in by_path and by_path["/"]["type"] != "d":
        raise refuse("/", "is not a directory")
    for path, e in by_path.items():
        if path != "/":
            parent = path.rsplit("/", 1)[0] or "/"
            pe = by_path.get(parent)
            if pe is None:
                raise refuse(path, f"has no parent directory {parent!r} in the tree")
            if pe["type"] != "d":
                kind = "a symlink" if pe["type"] == "l" else "not a directory"
                raise refuse(path, f"lies under {parent!r}, which is {kind}")
        t = e["type"]
        if t == "l":
            target = e.get("target")
            if not isinstance(target, str) or not target or "\0" in target:
                raise refuse(path, "is a symlink without a valid target")
        elif t == "h":
            target = e.get("target")
            if path_problem(target):
                raise refuse(path, f"is a hard link to {target!r}, which {path_problem(target)}")
            te = by_path.get(target)
            if te is None or te["type"] != "f":
                raise refuse(path, f"is a hard link to {target!r}, which is not a regular "
                                   f"file of the tree")
        elif t == "f":
            _check_chunks(e, len(packs), csize, refuse)


def _check_chunks(e: dict, npacks: int, csize: int, refuse) -> None:
    path, chunks = e["path"], e.get("chunks")
    if not isinstance(chunks, list):
        raise refuse(path, "is a file without a chunk list")
    total = 0
    for i, ref in enumerate(chunks):
        if not (isinstance(ref, list) and len(ref) == 5 and isinstance(ref[0], str)
                and _DIGEST.fullmatch(ref[0]) and all(_nonneg_int(v) for v in ref[1:])):
            raise refuse(path, f"has a malformed chunk reference {ref!r}")
        if ref[1] >= npacks:
            raise refuse(path, f"names pack {ref[1]}, the tree has {npacks}")
        last = i == len(chunks) - 1
        if ref[4] > csize or (not last and ref[4] != csize) or ref[4] == 0:
            raise refuse(path, f"has chunk {i} of {ref[4]} bytes (chunk size {csize})")
        total += ref[4]
    if total != e["size"]:
        raise refuse(path, f"has chunks of {total} bytes for a size of {e['size']}")
