"""One BitTorrent v2 torrent per blob set, made the same way on every node.

The set is a list of items ``(digest, size)``: each item is one file of the torrent, named
by the digest's hex, holding the chunk's bytes as the node cache holds them (uncompressed:
sha256 of the file is the digest, so a node seeds its cache's entries as they are and
checks a chunk from a peer with one hash). Everything in the info dictionary follows from the digests
and sizes: the name (from the set's key), the file order (by name), the piece size (the
next power of two above the largest item, so a small item is one piece). Two nodes that
make the torrent of one set get the same info hash, so the torrent a node publishes to the
store is one any other node could have made.
"""

from __future__ import annotations

import hashlib
import os

import libtorrent as lt

from bootseer.store.digest import hex_of

PIECE_MIN = 16 * 1024          # the v2 block: the smallest piece BitTorrent v2 allows
PIECE_MAX = 4 * 1024 * 1024


def set_key(items) -> str:
    """Hex key of a set: equal keys, equal sets (order does not matter)."""
    text = "\n".join(sorted(f"{d} {size}" for d, size in items))
    return hashlib.sha256(text.encode()).hexdigest()


def torrent_name(key: str) -> str:
    return f"bootseer-{key[:24]}"


def file_name(digest: str) -> str:
    return hex_of(digest)


def piece_size(sizes) -> int:
    largest = max(sizes, default=1)
    p = PIECE_MIN
    while p < largest and p < PIECE_MAX:
        p *= 2
    return p


def make_torrent(save_path: str, items) -> bytes:
    """The torrent of ``items`` whose files lie in ``save_path/<torrent_name>/`` (hashed
    from there). Bencoded, without creation date or creator (they vary by node)."""
    items = sorted(set(items), key=lambda it: file_name(it[0]))
    name = torrent_name(set_key(items))
    files = [lt.create_file_entry(f"{name}/{file_name(digest)}", size) for digest, size in items]
    ct = lt.create_torrent(files, piece_size(size for _, size in items),
                           lt.create_torrent.v2_only)
    lt.set_piece_hashes(ct, os.fspath(save_path))
    t = ct.generate()
    for volatile in (b"creation date", b"created by", "creation date", "created by"):
        t.pop(volatile, None)
    return lt.bencode(t)


def load_torrent(data: bytes, items) -> lt.torrent_info:
    """Parse a published torrent and check it describes exactly ``items`` (names, sizes,
    v2 piece size): a torrent from the store is as untrusted as any blob."""
    ti = lt.torrent_info(lt.bdecode(data))
    items = sorted(set(items), key=lambda it: file_name(it[0]))
    fs = ti.layout()
    got = sorted((os.path.basename(fs.file_path(i)), fs.file_size(i))
                 for i in range(fs.num_files()) if not fs.file_flags(i) & fs.flag_pad_file)
    want = sorted((file_name(d), size) for d, size in items)
    if (got != want or ti.name() != torrent_name(set_key(items))
            or ti.piece_length() != piece_size(size for _, size in items)
            or not ti.info_hashes().has_v2()):
        raise ValueError("the torrent does not describe this set")
    return ti
