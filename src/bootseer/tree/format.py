"""The TOC: a zstd-compressed JSON document whose digest is the tree's digest.

    {"v": 1, "kind": "bootseer.tree", "chunk_size": 1048576,
     "packs": ["sha256:...", ...],
     "entries": [{"path": "/usr/bin/python3", "type": "f"|"d"|"l"|"h"|"c"|"b"|"p",
                  "mode": 0o755, "uid": 0, "gid": 0, "mtime": 1700000000.0, "size": 123,
                  "target": "...",              # symlink target, or hard link's first path
                  "rdev": 0,                    # device nodes (recorded, never mounted)
                  "xattrs": {"user.x": "<base64>"},
                  "chunks": [["sha256:<uncompressed>", pack_index, offset, clen, ulen], ...]}],
     "meta": {...}}
"""

from __future__ import annotations

import json

from bootseer.errors import BootseerError

VERSION = 1
KIND = "bootseer.tree"


class TreeFormatError(BootseerError, ValueError):
    pass


def encode(toc: dict) -> bytes:
    import zstandard
    return zstandard.ZstdCompressor(level=9).compress(
        json.dumps(toc, separators=(",", ":"), sort_keys=True).encode())


def decode(blob: bytes, digest: str = "") -> dict:
    import zstandard
    try:
        toc = json.loads(zstandard.ZstdDecompressor().decompress(blob, max_output_size=1 << 31))
    except (zstandard.ZstdError, ValueError, UnicodeDecodeError) as e:
        raise TreeFormatError(f"{digest or 'blob'} is not a bootseer tree TOC: {e}") from e
    if not isinstance(toc, dict) or toc.get("kind") != KIND:
        raise TreeFormatError(f"{digest or 'blob'} is not a bootseer tree TOC (kind "
                              f"{toc.get('kind') if isinstance(toc, dict) else type(toc).__name__!r})")
    if toc.get("v") != VERSION:
        raise TreeFormatError(f"tree {digest} has format version {toc.get('v')}, this bootseer "
                              f"reads version {VERSION}")
    from bootseer.tree import validate   # the store is untrusted: check before any use
    validate.check(toc, digest)
    return toc
