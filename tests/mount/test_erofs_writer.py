"""The EROFS metadata writer on its own (no mount, no root): images erofs-utils'
fsck.erofs accepts and extracts byte for byte, and trees the writer refuses."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from bootseer.mount.erofs.layout import BLOCK
from bootseer.mount.erofs.writer import ImageError, Inode, write_image
from tests.conftest import need

CHUNK = 4 * BLOCK


def _blob_tree():
    """A root with a multi-chunk file, a file sharing a chunk, an empty file, a
    directory of 300 entries (dirents span blocks), short and long symlinks and a
    hard link; returns (root, blob bytes, expected {path: bytes})."""
    chunks = [os.urandom(CHUNK), os.urandom(CHUNK), os.urandom(100)]
    blob = b"".join(c.ljust(CHUNK, b"\0") for c in chunks)
    big = Inode(stat.S_IFREG, 0o644, size=2 * CHUNK + 100, chunk_blocks=[0, 4, 8])
    tail = Inode(stat.S_IFREG, 0o600, uid=7, size=100, chunk_blocks=[8])
    many = {f"entry-{i:03d}-with-a-long-name".encode(): Inode(stat.S_IFREG, 0o644)
            for i in range(300)}
    root = Inode(stat.S_IFDIR, 0o755, entries={
        b"big": big, b"hard": big, b"tail": tail, b"empty": Inode(stat.S_IFREG, 0o644),
        b"many": Inode(stat.S_IFDIR, 0o755, entries=many, xattrs={"user.a": b"1"}),
        b"short": Inode(stat.S_IFLNK, 0o777, target=b"big"),
        b"long": Inode(stat.S_IFLNK, 0o777, target=b"x/" * 2030)})   # > a block with its inode
    expect = {"big": b"".join(chunks), "hard": b"".join(chunks), "tail": chunks[2],
              "empty": b""}
    expect.update({f"many/{n.decode()}": b"" for n in many})
    return root, blob, expect


def test_fsck_erofs_accepts_and_extracts_the_image(tmp_path):
    need(shutil.which("fsck.erofs") is not None, "fsck.erofs missing (apt-get install erofs-utils)")
    root, blob, expect = _blob_tree()
    image, stats = write_image(root, chunk_size=CHUNK, blob_blocks=len(blob) // BLOCK, tag=b"t")
    assert stats.inodes == 307 and stats.skipped_xattrs == 0
    (tmp_path / "meta").write_bytes(image)
    (tmp_path / "blob").write_bytes(blob)
    out = tmp_path / "out"
    r = subprocess.run(["fsck.erofs", f"--device={tmp_path / 'blob'}", f"--extract={out}",
                        str(tmp_path / "meta")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for path, data in expect.items():
        assert (out / path).read_bytes() == data, path
    assert os.readlink(out / "long") == "x/" * 2030 and os.readlink(out / "short") == "big"


def test_writer_refuses_what_erofs_cannot_say():
    f = Inode(stat.S_IFREG, size=CHUNK + 1, chunk_blocks=[0])   # needs two chunks
    with pytest.raises(ImageError, match="needs 2 chunks"):
        write_image(Inode(stat.S_IFDIR, entries={b"f": f}), chunk_size=CHUNK, blob_blocks=8)
    with pytest.raises(ImageError, match="power of two"):
        write_image(Inode(stat.S_IFDIR, entries={}), chunk_size=3 * BLOCK, blob_blocks=1)
    for bad in (b"..", b"a/b", b""):
        with pytest.raises(ImageError, match="invalid name"):
            write_image(Inode(stat.S_IFDIR, entries={bad: Inode(stat.S_IFREG)}),
                        chunk_size=CHUNK, blob_blocks=1)
    # a namespace EROFS has no index for is left out and counted, not written wrong
    _, stats = write_image(Inode(stat.S_IFDIR, entries={}, xattrs={"system.other": b"x"}),
                           chunk_size=CHUNK, blob_blocks=1)
    assert stats.skipped_xattrs == 1
