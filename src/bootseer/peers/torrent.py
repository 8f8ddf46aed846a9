"""One BitTorrent v2 torrent per blob set, made the same way on every node.

The set is a list of items (``source.SetItem``: digest, size) in its canonical order, each
digest once (the set's adapter orders them: pack order for a tree's chunks, file and stripe
order for a checkpoint's stripes). Each file of the torrent holds items as their digests
name them (an item's sha256 is its digest, so an item from a peer is checked with one
hash):

* a large item (``SMALL_ITEM`` or more) is a file of its own, holding exactly the item's
  bytes: a node seeds a local file of it as it is (hard-linked into the seed copy);
* small items (an environment's modules) travel packed: each run of them in set order is
  concatenated into a bundle file of at most ``BUNDLE_BYTES``, one piece. BitTorrent v2
  aligns every file to a piece, so unpacked each 3 KiB module was a piece of its own, with
  its request, hash, file on disk and alerts: a thousand of them cost libtorrent and the
  node more than the megabytes did.

Files are named ``<position>-<digest hex>`` (``<position>-bundle`` for a bundle): a v2
torrent lists its files sorted by name, and the position keeps them, and so the pieces, in
set order. Everything in the info dictionary follows from the items: the name (from the
set's key), the files, the piece size (the next power of two above the largest file, so a
large item starts a piece and a bundle is one); creation date and creator are left out.
Two nodes that make the torrent of one set get the same info hash, so the torrent a node
publishes to the store is one any other node could have made.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import libtorrent as lt

from bootseer.peers.source import SetItem
from bootseer.store.digest import hex_of

PIECE_MIN = 16 * 1024          # the v2 block: the smallest piece BitTorrent v2 allows
PIECE_MAX = 4 * 1024 * 1024
SMALL_ITEM = 64 * 1024         # items below this travel packed into bundles
BUNDLE_BYTES = 1 << 20         # a bundle's size at most (one piece: the piece size is above)
LAYOUT = "bootseer-set-2"      # in the set's key: a torrent of the earlier layout is not found


@dataclass(frozen=True)
class Member:
    """An item in a torrent file: its digest, where it starts in the file, its size."""
    digest: str
    offset: int
    size: int


@dataclass(frozen=True)
class TorrentFile:
    name: str
    size: int
    members: tuple[Member, ...]

    @property
    def bundle(self) -> bool:
        return self.name.endswith("-bundle")


def set_key(items: list[SetItem]) -> str:
    """Hex key of a set: equal keys, equal sets in equal order."""
    text = "\n".join([LAYOUT, *(f"{i.digest} {i.size}" for i in items)])
    return hashlib.sha256(text.encode()).hexdigest()


def torrent_name(key: str) -> str:
    return f"bootseer-{key[:24]}"


def file_name(digest: str) -> str:
    """An item's name in a set (its digest's hex)."""
    return hex_of(digest)


def layout(items: list[SetItem]) -> list[TorrentFile]:
    """The torrent's files for ``items`` (in set order): large items alone, runs of small
    ones packed into bundles."""
    files: list[TorrentFile] = []
    run: list[tuple[str, int]] = []

    def close_run() -> None:
        if run:
            members, off = [], 0
            for d, size in run:
                members.append(Member(d, off, size))
                off += size
            files.append(TorrentFile(f"{len(files):06d}-bundle", off, tuple(members)))
            run.clear()

    for item in items:
        digest, size = item.digest, item.size
        if size >= SMALL_ITEM:
            close_run()
            files.append(TorrentFile(f"{len(files):06d}-{file_name(digest)}", size,
                                     (Member(digest, 0, size),)))
            continue
        if run and sum(s for _, s in run) + size > BUNDLE_BYTES:
            close_run()
        run.append((digest, size))
    close_run()
    return files


def piece_size(files: list[TorrentFile]) -> int:
    largest = max((f.size for f in files), default=1)
    p = PIECE_MIN
    while p < largest and p < PIECE_MAX:
        p *= 2
    return p


def put_member(files_dir: Path, tfile: TorrentFile, member: Member, data: bytes) -> None:
    """Write an item's bytes where its torrent file holds them (in a bundle: at its
    offset; the other members may come later)."""
    fd = os.open(files_dir / tfile.name, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, member.offset)
    finally:
        os.close(fd)


def make_torrent(save_path: str, items: list[SetItem]) -> bytes:
    """The torrent of ``items`` whose files lie in
    ``save_path/<torrent_name>/`` (hashed from there). Bencoded, without creation date or
    creator (they vary by node)."""
    items = list(items)
    name = torrent_name(set_key(items))
    files = layout(items)
    entries = [lt.create_file_entry(f"{name}/{f.name}", f.size) for f in files]
    ct = lt.create_torrent(entries, piece_size(files), lt.create_torrent.v2_only)
    lt.set_piece_hashes(ct, os.fspath(save_path))
    t = ct.generate()
    for volatile in (b"creation date", b"created by", "creation date", "created by"):
        t.pop(volatile, None)
    return lt.bencode(t)


def load_torrent(data: bytes, items: list[SetItem]) -> lt.torrent_info:
    """Parse a published torrent and check it describes exactly ``items`` (files, sizes,
    order, v2 piece size): a torrent from the store is as untrusted as any blob."""
    ti = lt.torrent_info(data)
    items = list(items)
    files = layout(items)
    fs = ti.layout()
    got = [(os.path.basename(fs.file_path(i)), fs.file_size(i))
           for i in range(fs.num_files()) if not fs.file_flags(i) & fs.flag_pad_file]
    if (got != [(f.name, f.size) for f in files] or ti.name() != torrent_name(set_key(items))
            or ti.piece_length() != piece_size(files) or not ti.info_hashes().has_v2()):
        raise ValueError("the torrent does not describe this set")
    return ti
