"""The TOC's records (Toc, Entry, ChunkRef) and its stored form: a TOC written before
the records were types (``data/v1-toc.zst``, with its pack ``data/v1-pack.bin``) decodes,
encodes to the same bytes, and its tree reads and restores as it did; the builder still
writes exactly those bytes for the same input."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from pathlib import Path

import pytest
import zstandard

from bootseer.config import CacheConfig
from bootseer.store import open_store
from bootseer.store.cache import NodeCache
from bootseer.store.digest import sha256_digest
from bootseer.store.fetch import Fetcher
from bootseer.tree import format as fmt
from bootseer.tree import meta_image
from bootseer.tree.blob import BlobLayout
from bootseer.tree.build import BuildStats, TreeBuilder
from bootseer.tree.extract import chunk_order, extract, plan
from bootseer.tree.reader import TreeReader
from bootseer.tree.toc import ChunkRef, Entry, Toc, TreeFormatError

DATA = Path(__file__).parent / "data"
BIG = bytes(range(256)) * 40   # 10240 bytes: chunks of 4096, 4096, 2048


def legacy_store(root: Path):
    """A store holding the legacy tree; returns (store, tree digest, TOC bytes)."""
    store = open_store(str(root))
    toc = (DATA / "v1-toc.zst").read_bytes()
    pack = (DATA / "v1-pack.bin").read_bytes()
    store.write(sha256_digest(pack), pack)
    store.write(sha256_digest(toc), toc)
    return store, sha256_digest(toc), toc


def build_legacy_input(store) -> str:
    """The input the legacy TOC was built from: every entry type, xattrs, hard links (to
    a file and to a symlink), deduplicated chunks, an int and float mtimes, meta."""
    b = TreeBuilder(store, chunk_size=4096, pack_size=1 << 20)
    b.add_dir("/", 0o755, mtime=1700000000.0)
    b.add_dir("/etc", 0o755, mtime=1700000001.5,
              xattrs={"user.d": base64.b64encode(b"dir").decode()})
    b.add_file("/etc/conf", b"key=value\n", 0o644, uid=1000, gid=1000, mtime=1700000002,
               xattrs={"user.note": base64.b64encode(b"hi").decode()})
    b.add_file("/bin/tool", BIG, 0o4755, mtime=1700000003.25)
    b.add_file("/bin/copy", BIG, 0o755)
    b.add_file("/empty", b"", 0o600)
    b.add_symlink("/bin/alias", "tool", uid=1, gid=2, mtime=5.0)
    b.add_hardlink("/bin/hard", "/bin/tool")
    b.add_hardlink("/bin/alias2", "/bin/alias")
    b.add_special("/dev/null", "c", 0o666, rdev=259)
    b.add_special("/dev/blk", "b", 0o660, rdev=2049)
    b.add_special("/run/fifo", "p", 0o644)
    digest = b.finish({"env": ["PATH=/bin"], "chain_ids": ["sha256:" + "a" * 64]}, erofs=())
    assert b.stats == BuildStats(files=4, bytes=2 * len(BIG) + 10, chunks=7, dedup_chunks=4,
                                 stored_bytes=b.stats.stored_bytes)
    return digest


def test_a_legacy_toc_decodes_to_records_and_encodes_to_the_same_bytes():
    blob = (DATA / "v1-toc.zst").read_bytes()
    toc = fmt.decode(blob)
    assert isinstance(toc, Toc) and toc.chunk_size == 4096 and len(toc.packs) == 1
    assert fmt.encode(toc) == blob
    by_path = {e.path: e for e in toc.entries}
    tool = by_path["/bin/tool"]
    assert (tool.type, tool.mode, tool.size, tool.mtime) == ("f", 0o4755, 10240, 1700000003.25)
    assert [c.size for c in tool.chunks] == [4096, 4096, 2048]
    assert tool.chunks[0] == tool.chunks[1] and tool.chunks[0].end == 19 + 276
    assert by_path["/etc/conf"].mtime == 1700000002 and type(by_path["/etc/conf"].mtime) is int
    assert by_path["/bin/hard"].target == "/bin/tool" and by_path["/bin/hard"].chunks is None
    assert by_path["/dev/null"].rdev == 259 and by_path["/run/fifo"].rdev == 0
    assert by_path["/etc"].xattrs == {"user.d": "ZGly"} and by_path["/bin/copy"].xattrs is None
    assert by_path["/empty"].chunks == ()
    assert toc.meta["env"] == ["PATH=/bin"]
    assert [c.digest for c in toc.distinct_chunks()] == [tool.chunks[0].digest,
                                                         tool.chunks[2].digest,
                                                         by_path["/etc/conf"].chunks[0].digest]
    assert [e.path for e in toc.files()] == ["/bin/copy", "/bin/tool", "/empty", "/etc/conf"]


def test_the_builder_writes_the_legacy_bytes_for_the_same_input(tmp_path):
    store = open_store(str(tmp_path / "store"))
    assert build_legacy_input(store) == sha256_digest((DATA / "v1-toc.zst").read_bytes())


def test_records_are_immutable():
    ref = ChunkRef("sha256:" + "0" * 64, 0, 0, 1, 1)
    e = Entry("/a", "f", 0o644, 0, 0, 0.0, 1, chunks=(ref,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.size = 2   # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.path = "/b"   # type: ignore[misc]
    toc = Toc(4096, (), (e,))
    assert toc.meta == {} and not hasattr(toc, "__dict__")


def test_a_tree_already_in_a_store_reads_and_restores(tmp_path):
    store, tree, _ = legacy_store(tmp_path / "store")
    cache = NodeCache(CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30))
    with Fetcher() as f:
        r = TreeReader(store, tree, f, cache)
        assert r.read("/bin/tool", 1 << 20, 0) == BIG
        assert r.read("/bin/hard", 100, 4090) == BIG[4090:4190]
        assert r.entry("/bin/hard").mode == 0o4755 and r.entry("/bin/hard").path == "/bin/hard"
        assert r.read("/etc/conf", 100, 0) == b"key=value\n"
        assert r.total_bytes() == 2 * len(BIG) + 10
        out = tmp_path / "out"
        timing: dict = {}
        progress: list[int] = []
        cold = TreeReader(store, tree, f)   # no node cache: every chunk is fetched
        assert extract(cold, out, chown=False, timing=timing, progress=progress.append) == \
            2 * len(BIG) + 10
    assert (out / "bin/tool").read_bytes() == BIG == (out / "bin/copy").read_bytes()
    assert os.stat(out / "bin/hard").st_ino == os.stat(out / "bin/tool").st_ino
    assert os.readlink(out / "bin/alias") == "tool" == os.readlink(out / "bin/alias2")
    assert os.getxattr(out / "etc/conf", "user.note") == b"hi"
    assert not (out / "dev/null").exists()   # device nodes are never restored
    assert timing["chunks"] == 3 and "fetched_at" in timing   # each distinct chunk once
    assert sorted(progress) == [10, 2048, 4096]


def test_the_restore_plan_writes_a_linked_file_once_under_its_first_name():
    toc = fmt.decode((DATA / "v1-toc.zst").read_bytes())
    steps = plan(toc.entries)
    actions = {s.entry.path: (s.action, s.src.path) for s in steps}
    assert actions["/bin/hard"] == ("file", "/bin/tool")   # first in depth-first order
    assert actions["/bin/tool"] == ("link", "/bin/tool")
    assert "/dev/null" not in actions and actions["/bin/alias2"] == ("l", "/bin/alias2")
    order = chunk_order(steps)
    assert [c.size for c in order] == [4096, 4096, 2048, 4096, 4096, 2048, 10]


def test_a_stored_toc_document_keeps_its_json(tmp_path):
    """Decoding then encoding changes no byte of the JSON either (key order, number
    forms, absent optional keys)."""
    blob = (DATA / "v1-toc.zst").read_bytes()
    raw = zstandard.ZstdDecompressor().decompress(blob, max_output_size=1 << 20)
    again = zstandard.ZstdDecompressor().decompress(fmt.encode(fmt.decode(blob)),
                                                    max_output_size=1 << 20)
    assert again == raw and json.loads(raw)["entries"][0]["mtime"] == 1700000000.0


def test_the_rules_know_the_records_not_the_codec():
    """``validate`` checks what ``format`` parsed: it imports the records' module, never
    the codec (which imports it), so the two form no circle."""
    import ast

    from bootseer.tree import validate
    tree = ast.parse(Path(validate.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "bootseer.tree.toc" in imported
    assert not {m for m in imported if m and m.startswith("bootseer.tree.format")}
    assert not any(isinstance(n, ast.ImportFrom) and n.module == "bootseer.tree"
                   and any(a.name == "format" for a in n.names) for n in ast.walk(tree))


def test_a_tree_names_its_stored_metadata_image_and_encodes_to_the_same_bytes(tmp_path):
    """The builder stores the tree's metadata image and names it in the TOC (what the tree
    digest covers); a TOC with the field decodes and encodes to its own bytes."""
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=4096)
    b.add_file("/a", b"x" * 5000)
    digest = b.finish()
    blob = store.read(digest)
    toc = fmt.decode(blob, digest)
    assert set(toc.erofs) == {"format", "layout", "images"} and set(toc.erofs["images"]) == {"tree"}
    image = store.read(toc.erofs["images"]["tree"])   # the store checked it against its digest
    assert image == meta_image.image_of(digest, toc, BlobLayout(toc))
    assert toc.erofs["layout"] == BlobLayout(toc).key
    assert fmt.encode(toc) == blob


@pytest.mark.parametrize("field", [
    "sha256:" + "0" * 64, {"format": "x", "layout": "y"},
    {"format": "x", "layout": "y", "images": {"tree": "md5:00"}}])
def test_a_malformed_erofs_field_refuses_the_tree(field):
    doc = {"v": 1, "kind": "bootseer.tree", "chunk_size": 4096, "packs": [], "meta": {},
           "entries": [{"path": "/", "type": "d", "mode": 0o755, "uid": 0, "gid": 0,
                        "mtime": 0.0, "size": 0}], "erofs": field}
    blob = zstandard.ZstdCompressor().compress(json.dumps(doc).encode())
    with pytest.raises(TreeFormatError, match="field 'erofs' is malformed"):
        fmt.decode(blob)
