"""The stored form of a TOC: zstd-compressed JSON whose digest is the tree's digest.

    {"v": 1, "kind": "bootseer.tree", "chunk_size": 1048576,
     "packs": ["sha256:...", ...],
     "entries": [{"path": "/usr/bin/python3", "type": "f"|"d"|"l"|"h"|"c"|"b"|"p",
                  "mode": 0o755, "uid": 0, "gid": 0, "mtime": 1700000000.0, "size": 123,
                  "target": "...",              # symlink target, or hard link's first path
                  "rdev": 0,                    # device nodes (recorded, never mounted)
                  "xattrs": {"user.x": "<base64>"},
                  "chunks": [["sha256:<uncompressed>", pack_index, offset, clen, ulen], ...]}],
     "meta": {...},
     "erofs": {"format": "bootseer.erofs-meta.v1", "layout": "<hex>",   # optional
               "images": {"tree": "sha256:...", "env": "sha256:..."}},
     "blocks": {"digest": "sha256:...", "block_size": 65536}}   # optional: the block table

Keys are sorted and separators compact, so a TOC decoded and encoded again is the same
bytes (the same tree digest). The records it decodes to are ``bootseer.tree.toc``'s; this
module is the only one that sees the JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bootseer.tree import validate
from bootseer.tree.toc import (
    KIND,
    VERSION,
    ChunkRef,
    Entry,
    Toc,
    TreeFormatError,
    records_without_cycles,
)

_OPTIONAL = ("target", "rdev", "xattrs")


def encode(toc: Toc) -> bytes:
    import zstandard
    doc = {"v": VERSION, "kind": KIND, "chunk_size": toc.chunk_size, "packs": list(toc.packs),
           "meta": toc.meta, "entries": [_entry_doc(e) for e in toc.entries]}
    if toc.erofs is not None:   # absent otherwise: an older tree encodes to its own bytes
        doc["erofs"] = toc.erofs
    if toc.blocks is not None:   # absent from older trees: their digests stay the same
        doc["blocks"] = toc.blocks
    return zstandard.ZstdCompressor(level=9).compress(
        json.dumps(doc, separators=(",", ":"), sort_keys=True).encode())


def decode(blob: bytes, digest: str = "") -> Toc:
    """The TOC in ``blob``, checked (``validate``: the store is untrusted) before any
    record is made of it."""
    with records_without_cycles():
        return _decode(blob, digest)


def _decode(blob: bytes, digest: str) -> Toc:
    import zstandard
    try:
        doc = json.loads(zstandard.ZstdDecompressor().decompress(blob, max_output_size=1 << 31))
    except (zstandard.ZstdError, ValueError, UnicodeDecodeError) as e:
        raise TreeFormatError(f"{digest or 'blob'} is not a bootseer tree TOC: {e}") from e
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise TreeFormatError(f"{digest or 'blob'} is not a bootseer tree TOC (kind {kind!r})")
    if doc.get("v") != VERSION:
        raise TreeFormatError(f"tree {digest} has format version {doc.get('v')}, this bootseer "
                              f"reads version {VERSION}")
    validate.check(doc, digest)
    return Toc(doc["chunk_size"], tuple(doc["packs"]),
               tuple(_entry(e) for e in doc["entries"]), doc.get("meta") or {},
               doc.get("erofs"), doc.get("blocks"))


def _maker(cls: type) -> Callable[..., Any]:
    """A constructor of the frozen record ``cls`` taking every field positionally, that
    sets the slots directly: a frozen dataclass's ``__init__`` makes one
    ``object.__setattr__`` call per field, a TOC holds one Entry per path and one ChunkRef
    per chunk, and loading it is on the path of every start."""
    names: tuple[str, ...] = cls.__dict__["__slots__"]
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    scope.update({f"set_{n}": getattr(cls, n).__set__ for n in names})
    args = ", ".join(names)
    body = "".join(f"    set_{n}(o, {n})\n" for n in names)
    # the source names only the record's own slots (as dataclasses' generated methods do)
    exec(f"def make({args}):\n    o = new(cls)\n{body}    return o\n", scope)
    return scope["make"]


new_entry, new_ref = _maker(Entry), _maker(ChunkRef)


def _entry(e: dict) -> Entry:
    chunks, get = e.get("chunks"), e.get
    return new_entry(e["path"], e["type"], e["mode"], e["uid"], e["gid"], e["mtime"], e["size"],
                     get("target"), get("rdev"), get("xattrs"),
                     None if chunks is None else tuple([new_ref(*c) for c in chunks]))


def _entry_doc(e: Entry) -> dict:
    doc = {"path": e.path, "type": e.type, "mode": e.mode, "uid": e.uid, "gid": e.gid,
           "mtime": e.mtime, "size": e.size}
    for key in _OPTIONAL:
        value = getattr(e, key)
        if value is not None:
            doc[key] = value
    if e.chunks is not None:
        doc["chunks"] = [[c.digest, c.pack, c.offset, c.stored, c.size] for c in e.chunks]
    return doc
