"""A TOC comes from the store, which is untrusted: every TOC is checked when it is loaded,
before any entry is mounted or restored, and a tree that breaks a rule is refused whole,
with one line naming the offending path.

Rules: paths are canonical and absolute inside the tree (``/`` then components that are not
empty, ``.`` or ``..``, no NUL), each appears once, and every entry's parent is a directory
entry of the tree (so nothing lies under a symlink or a file); a hard link names a regular
file of the tree; a file's chunk list covers exactly its size in fixed-size chunks of known
packs. Restore then creates entries relative to directory descriptors it opened itself
(``extract``), so even a rule missed here cannot lead it through a symlink.

The check reads the TOC's JSON document as ``format.decode`` parsed it: an untrusted
document is checked before any record (``bootseer.tree.toc``) is made of it.
"""

from __future__ import annotations

import re
from typing import TypeGuard

from bootseer.tree.toc import TYPES, TreeFormatError

_NUMBER = (int, float)
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


def _nonneg_int(v: object) -> TypeGuard[int]:
    return type(v) is int and v >= 0   # not a bool either


def _canonical(path: object) -> TypeGuard[str]:
    """The common case of ``path_problem(path) is None``, in a few C string scans."""
    return type(path) is str and (path == "/" or (
        path[:1] == "/" and "\0" not in path and "//" not in path and "/./" not in path
        and "/../" not in path and not path.endswith(("/", "/.", "/.."))))


def check(doc: dict, digest: str = "") -> None:
    """Raise TreeFormatError unless every entry of the TOC document ``doc`` keeps to the
    rules (the common cases cost a few C calls per entry)."""
    name = f"tree {digest[:19]}" if digest else "tree"

    def refuse(path: object, why: str) -> TreeFormatError:
        return TreeFormatError(f"{name} is refused: entry {path!r} {why}")

    entries = doc.get("entries")
    packs = doc.get("packs")
    csize = doc.get("chunk_size")
    if type(entries) is not list or type(packs) is not list or not (
            _nonneg_int(csize) and csize > 0):
        raise TreeFormatError(f"{name} is refused: its TOC lacks entries, packs or chunk_size")
    for p in packs:
        if type(p) is not str or not _DIGEST.fullmatch(p):
            raise TreeFormatError(f"{name} is refused: pack {p!r} is not a sha256 digest")
    if "erofs" in doc:
        _check_erofs(doc["erofs"], name)
    blocks = doc.get("blocks")
    if blocks is not None:
        bsize = blocks.get("block_size") if type(blocks) is dict else None
        if not (type(blocks) is dict and set(blocks) == {"digest", "block_size"}
                and type(blocks["digest"]) is str and _DIGEST.fullmatch(blocks["digest"])
                and type(bsize) is int and 4096 <= bsize < csize and csize % bsize == 0
                and not bsize & (bsize - 1)):
            raise TreeFormatError(f"{name} is refused: its block table {blocks!r} is not "
                                  "a digest and a power-of-two block size dividing the chunks")
    by_path: dict[str, dict] = {}
    for e in entries:
        if type(e) is not dict:
            raise TreeFormatError(f"{name} is refused: an entry is not an object")
        path = e.get("path")
        if not _canonical(path):
            raise refuse(path, path_problem(path) or "is not canonical")
        if path in by_path:
            raise refuse(path, "appears twice")
        mode, uid, gid, size = e.get("mode"), e.get("uid"), e.get("gid"), e.get("size")
        if not (type(mode) is int and type(uid) is int and type(gid) is int
                and type(size) is int and 0 <= mode <= 0o7777 and uid >= 0 and gid >= 0
                and size >= 0 and e.get("type") in TYPES and "xattrs" not in e
                and type(e.get("mtime")) in _NUMBER):
            _check_fields(e, refuse)   # the slow path: finds what is wrong, if anything
        by_path[path] = e
    if "/" in by_path and by_path["/"]["type"] != "d":
        raise refuse("/", "is not a directory")
    npacks = len(packs)
    for path, e in by_path.items():
        if path != "/":
            pe = by_path.get(path[:path.rindex("/")] or "/")
            if pe is None or pe["type"] != "d":
                parent = path[:path.rindex("/")] or "/"
                if pe is None:
                    raise refuse(path, f"has no parent directory {parent!r} in the tree")
                kind = "a symlink" if pe["type"] == "l" else "not a directory"
                raise refuse(path, f"lies under {parent!r}, which is {kind}")
        t = e["type"]
        if t == "f":
            _check_chunks(e, npacks, csize, refuse)
        elif t == "l":
            target = e.get("target")
            if type(target) is not str or not target or "\0" in target:
                raise refuse(path, "is a symlink without a valid target")
        elif t == "h":
            target = e.get("target")
            if not _canonical(target):
                raise refuse(path, f"is a hard link to {target!r}, which "
                                   f"{path_problem(target) or 'is not canonical'}")
            te = by_path.get(target)
            if te is None or te["type"] != "f":
                raise refuse(path, f"is a hard link to {target!r}, which is not a regular "
                                   f"file of the tree")


def _check_erofs(field: object, name: str) -> None:
    """The optional field naming the stored metadata images: a format and a layout key
    (strings) and images by variant, each a sha256 digest."""
    images = field.get("images") if type(field) is dict else None
    if not (type(field) is dict and type(field.get("format")) is str
            and type(field.get("layout")) is str and type(images) is dict
            and all(type(k) is str and type(v) is str and _DIGEST.fullmatch(v)
                    for k, v in images.items())):
        raise TreeFormatError(f"{name} is refused: its field 'erofs' is malformed "
                              f"(format, layout and images by variant, each a sha256 digest)")


def _check_fields(e: dict, refuse) -> None:
    path, mtime = e["path"], e.get("mtime")
    if e.get("type") not in TYPES:
        raise refuse(path, f"has unknown type {e.get('type')!r}")
    for field in ("mode", "uid", "gid", "size"):
        if not _nonneg_int(e.get(field)):
            raise refuse(path, f"has an invalid {field} {e.get(field)!r}")
    mode: int = e["mode"]   # a non-negative int: the loop just checked it
    if mode > 0o7777:
        raise refuse(path, f"has mode bits beyond 0o7777 ({mode:#o})")
    if type(mtime) not in _NUMBER:
        raise refuse(path, f"has an invalid mtime {mtime!r}")
    xattrs = e.get("xattrs")
    if xattrs is not None and (type(xattrs) is not dict or not all(
            type(k) is str and type(v) is str for k, v in xattrs.items())):
        raise refuse(path, "has malformed xattrs")


def _check_chunks(e: dict, npacks: int, csize: int, refuse) -> None:
    path, chunks = e["path"], e.get("chunks")
    if type(chunks) is not list:
        raise refuse(path, "is a file without a chunk list")
    total, last = 0, len(chunks) - 1
    for i, ref in enumerate(chunks):
        if type(ref) is not list or len(ref) != 5:
            raise refuse(path, f"has a malformed chunk reference {ref!r}")
        d, pack, offset, clen, ulen = ref
        if not (type(pack) is int and type(offset) is int and type(clen) is int
                and type(ulen) is int and offset >= 0 and clen >= 0
                and type(d) is str and _DIGEST.fullmatch(d)):
            raise refuse(path, f"has a malformed chunk reference {ref!r}")
        if not 0 <= pack < npacks:
            raise refuse(path, f"names pack {pack}, the tree has {npacks}")
        if not 0 < ulen <= csize or (ulen != csize and i != last):
            raise refuse(path, f"has chunk {i} of {ulen} bytes (chunk size {csize})")
        total += ulen
    if total != e["size"]:
        raise refuse(path, f"has chunks of {total} bytes for a size of {e['size']}")
