"""Where a set's items lie in its torrent's pieces, and which pieces read back complete
which items. BitTorrent v2 aligns every file to a piece with pad files (which hold no
item): a large item spans pieces of its own, a bundle is one piece holding its members."""

from __future__ import annotations

import os

from bootseer.peers.torrent import Member, TorrentFile, file_name


class PieceMap:
    """The pieces of torrent ``ti`` (whose files are ``tfiles``) by item name, and the
    pieces read back so far that an item not yet delivered still needs."""

    def __init__(self, ti, tfiles: list[TorrentFile],
                 file_of: dict[str, tuple[TorrentFile, Member]]):
        fs, plen = ti.layout(), ti.piece_length()
        by_name = {f.name: f for f in tfiles}
        self.file_of = file_of
        self.names: list[str] = []   # the torrent's file names by index (pad files too)
        self.span: dict[str, tuple[int, int]] = {}   # item -> (first piece, pieces)
        self.items_in: dict[int, list[str]] = {}   # piece -> the items in it
        for i in range(fs.num_files()):
            name = os.path.basename(fs.file_path(i))
            self.names.append(name)
            if fs.file_flags(i) & fs.flag_pad_file:
                continue
            first, n = fs.piece_index_at_file(i), max(1, -(-fs.file_size(i) // plen))
            for m in by_name[name].members:
                item = file_name(m.digest)
                self.span[item] = (first, n)
                for k in range(n):
                    self.items_in.setdefault(first + k, []).append(item)
        self._got: dict[int, bytes] = {}

    def read_back(self, p: int, data: bytes, delivered: set[str]) -> list[tuple[str, bytes]]:
        """Piece ``p``'s bytes, read back: the items not in ``delivered`` it completes,
        with their bytes (a bundle's piece: its members; a large item's last piece: the
        item)."""
        self._got[p] = data
        out = []
        for name in self.items_in.get(p, ()):
            first, n = self.span[name]
            if name in delivered or not all(first + k in self._got for k in range(n)):
                continue
            _, m = self.file_of[name]
            raw = self._got[first] if n == 1 else b"".join(self._got[first + k]
                                                         for k in range(n))
            out.append((name, raw[m.offset:m.offset + m.size]))
        return out

    def release(self, p: int, delivered: set[str]) -> None:
        """Keep a piece read back only while an item of it still needs it."""
        for name in self.items_in.get(p, ()):
            first, n = self.span[name]
            if all(it in delivered for k in range(n) for it in self.items_in[first + k]):
                for k in range(n):
                    self._got.pop(first + k, None)
