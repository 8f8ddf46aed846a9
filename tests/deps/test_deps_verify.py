"""``deps verify`` hashes each file in fixed-size blocks: a file far larger than a block
(and than a chunk) is checked with the same results as hashing it whole, a changed byte
past the first block is found, and the memory it takes stays about one block."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tracemalloc

import pytest

from bootseer.cli.main import main
from bootseer.deps.snapshot import write_marker
from bootseer.store import open_store
from bootseer.tree import format as fmt
from bootseer.tree.build import TreeBuilder, add_directory

MiB = 1 << 20
BIG = 24 * MiB + 5   # many blocks, several chunks, a short last one


@pytest.fixture
def restored(tmp_path):
    """A snapshot with one big file and a small one, and a prefix holding its files as a
    restore leaves them; (prefix, store URL, the big file's TOC entry)."""
    src = tmp_path / "src"
    (src / "lib").mkdir(parents=True)
    (src / "lib/big.so").write_bytes(os.urandom(BIG))
    (src / "lib/small.py").write_bytes(b"X = 1\n")
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=4 * MiB, pack_size=8 * MiB)
    add_directory(b, src)
    tree = b.finish()
    prefix = tmp_path / "env"
    shutil.copytree(src, prefix)
    write_marker(str(prefix), "sha256:" + "0" * 64, tree)
    toc = fmt.decode(store.read(tree))
    [entry] = [e for e in toc.entries if e.path == "/lib/big.so"]
    return prefix, str(tmp_path / "store"), toc.chunk_size, entry


def _verify(prefix, store, capsys) -> dict:
    rc = main(["deps", "verify", str(prefix), "--store", store, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == (0 if doc["ok"] else 1)
    return doc


def test_streamed_digests_equal_the_whole_files(restored):
    from bootseer.deps.verify import BLOCK, file_matches
    prefix, _, chunk_size, entry = restored
    assert chunk_size > BLOCK and entry.size > 2 * chunk_size
    data = (prefix / "lib/big.so").read_bytes()
    whole = ["sha256:" + hashlib.sha256(data[i:i + chunk_size]).hexdigest()
             for i in range(0, len(data), chunk_size)]
    assert whole == [c.digest for c in entry.chunks]
    assert file_matches(str(prefix / "lib/big.so"), entry.chunks, chunk_size, BIG)
    assert not file_matches(str(prefix / "lib/big.so"), entry.chunks, chunk_size, BIG + 1)


@pytest.mark.slow
def test_a_byte_changed_past_the_first_block_is_found(restored, capsys):
    prefix, store, _, _ = restored
    assert _verify(prefix, store, capsys)["ok"] is True
    big = prefix / "lib/big.so"
    with open(big, "r+b") as f:
        f.seek(5 * MiB + 123)
        byte = f.read(1)
        f.seek(5 * MiB + 123)
        f.write(bytes([byte[0] ^ 1]))
    doc = _verify(prefix, store, capsys)
    assert doc["problems"] == [{"problem": "modified", "path": "/lib/big.so"}]
    with open(big, "r+b") as f:   # back as it was, and one byte more at the end
        f.seek(5 * MiB + 123)
        f.write(byte)
        f.seek(0, os.SEEK_END)
        f.write(b"\0")
    assert _verify(prefix, store, capsys)["problems"] == [
        {"problem": "modified", "path": "/lib/big.so"}]


def test_memory_stays_about_one_block_whatever_the_file_size(restored, capsys):
    prefix, store, _, _ = restored
    tracemalloc.start()
    try:
        doc = _verify(prefix, store, capsys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert doc["ok"] is True and doc["files"] == 2
    assert peak < BIG // 3, f"peak {peak} bytes to verify a {BIG}-byte file"


def test_a_relocated_files_bytes_compared_block_by_block(tmp_path):
    from bootseer.deps.verify import BLOCK, bytes_match
    want = os.urandom(2 * BLOCK + 7)
    path = tmp_path / "script"
    path.write_bytes(want)
    assert bytes_match(str(path), want)
    changed = bytearray(want)
    changed[BLOCK + 3] ^= 1
    for other in (bytes(changed), want[:-1], want + b"\n"):
        path.write_bytes(other)
        assert not bytes_match(str(path), want)
