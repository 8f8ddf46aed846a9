"""This node's copy of a set's torrent files, which libtorrent seeds from.

A copy lives as long as a process seeds it: each holds a shared lock on ``<key>.lock``
beside it (released when the process dies, however), and a new share removes the copies
nobody holds, so the disk holds the sets in use and no more.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from pathlib import Path

from bootseer.peers.source import ChunkSource, SetItem
from bootseer.peers.torrent import Member, TorrentFile, put_member, torrent_name
from bootseer.store.digest import sha256_digest

log = logging.getLogger(__name__)


def hold_set(directory: Path):
    directory.parent.mkdir(parents=True, exist_ok=True)
    f = open(f"{directory}.lock", "a")
    fcntl.flock(f, fcntl.LOCK_SH)
    return f


def remove_unused_sets(work_dir: Path) -> None:
    if not work_dir.is_dir():
        return
    for lock in work_dir.glob("*.lock"):
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue   # seeded by a live process
            # the lock file stays (a few bytes): unlinked, a process blocked on it
            # would hold a lock nobody else sees
            shutil.rmtree(lock.with_suffix(""), ignore_errors=True)


class SeedCopy:
    """The files of set ``key``'s torrent under ``<work_dir>/<key>/`` (the torrent's save
    path), held for this process's life; ``file_of``: each item's torrent file and place
    in it, by item name."""

    def __init__(self, work_dir: Path, key: str,
                 file_of: dict[str, tuple[TorrentFile, Member]]):
        self.dir = work_dir / key
        self._lock = hold_set(self.dir)   # while this process lives, nobody removes it
        self.files = self.dir / torrent_name(key)
        self.file_of = file_of
        self.on_disk: set[str] = set()   # items written here before the torrent exists

    def place_local(self, items: dict[str, SetItem], source: ChunkSource
                    ) -> dict[str, bytes | None]:
        """The items this node holds already (``source.local_path``) into the copy: hard
        links for items that are a file of their own (the local file holds exactly the
        torrent's bytes; libtorrent checks them), copies at their place for the members of
        a bundle (each checked by its digest). Returns the items placed: a bundle member's
        bytes (to complete the bundle's piece when the rest comes), None for a link."""
        placed: dict[str, bytes | None] = {}
        self.files.mkdir(parents=True, exist_ok=True)
        for name, item in items.items():
            tfile, m = self.file_of[name]
            src = source.local_path(item.digest)
            dest = self.files / tfile.name
            data = None
            try:
                if tfile.bundle:
                    if src is None:
                        continue
                    data = Path(src).read_bytes()
                    if sha256_digest(data) != item.digest:
                        continue   # its holder drops it when read; peers or the origin bring it
                    put_member(self.files, tfile, m, data)
                elif not dest.exists():
                    if src is None:
                        continue
                    os.link(src, dest)
            except OSError as e:   # another file system: it comes from peers or the origin
                log.debug("peers: cannot place %s in the seed copy: %s", name, e)
                continue
            placed[name] = data
            self.on_disk.add(name)
        return placed

    def put(self, name: str, data: bytes) -> None:
        """An item's verified bytes at their place (before the torrent exists)."""
        tfile, m = self.file_of[name]
        self.files.mkdir(parents=True, exist_ok=True)
        if tfile.bundle:
            put_member(self.files, tfile, m, data)
        else:
            tmp = self.files / f".{tfile.name}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, self.files / tfile.name)
        self.on_disk.add(name)
