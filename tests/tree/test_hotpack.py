"""The hot pack on the kernel path (EROFS on the FUSE-served blob): a start is recorded,
its profile published with the pack of its hot blocks, and a fresh node starts from the
pack: right bytes everywhere, fewer bytes than the hot chunks; a pack or a block that
fails its digest is never served (the chunk path serves); a tree without a block table
keeps the whole-chunk path."""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import time

import pytest
import zstandard

from bootseer.config import BootseerConfig, CacheConfig, MountConfig, StoreConfig
from bootseer.store import open_store
from bootseer.store.digest import sha256_digest
from bootseer.tree import hotpack
from bootseer.tree import profile as prof
from bootseer.tree.blob_mount import PREREAD
from bootseer.tree.build import TreeBuilder, add_directory
from bootseer.tree.session import mount_tree

pytestmark = [pytest.mark.timeout(120), pytest.mark.fuse]
MiB = 1 << 20


def _config(tmp_path, cache: str) -> BootseerConfig:
    return BootseerConfig(store=StoreConfig(url=str(tmp_path / "store")),
                          cache=CacheConfig(dir=str(tmp_path / cache), budget_bytes=1 << 30),
                          mount=MountConfig(backend="erofs"))


def _job(root) -> bytes:
    """A start's reads: a shard's header and a slice of the other, a few small files."""
    out = []
    with open(root / "data/shard-0.bin", "rb") as f:
        out.append(f.read(16 << 10))
    with open(root / "data/shard-1.bin", "rb") as f:
        f.seek(2 * MiB + 300)
        out.append(f.read(40 << 10))
    out += [(root / "pkg" / f"m{i}.py").read_bytes() for i in range(0, 12, 3)]
    return b"".join(out)


def _start(tmp_path, digest, cache: str, name: str, *, wait_preread: bool = False):
    """Mount on a node with cache ``cache``, run the job, close the window: (the job's
    bytes, every file's bytes, the start's figures)."""
    mp, state = tmp_path / name, tmp_path / f"{name}-state"
    mp.mkdir()
    handle, _, _ = mount_tree(_config(tmp_path, cache), digest, str(mp), str(state))
    try:
        assert handle.backend == "erofs-fuse-blob"
        deadline = time.time() + 20
        while wait_preread and not (state / PREREAD).exists() and time.time() < deadline:
            time.sleep(0.02)
        got = _job(mp)
        (state / "close-window").touch()
        while not (state / "figures.json").exists() and time.time() < deadline:
            time.sleep(0.05)
        # then every byte of the tree, most of it outside the hot blocks: on demand
        every = {p: (mp / p).read_bytes() for p in _files(tmp_path / "src")}
    finally:
        handle.unmount()
    return got, every, json.loads((state / "figures.json").read_text()), state


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def recorded(tmp_path, need_root):
    """A tree, one start recorded on a node, its profile published from that node."""
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "pkg").mkdir()
    for i in range(2):
        (src / "data" / f"shard-{i}.bin").write_bytes(os.urandom(4 * MiB))
    for i in range(12):
        (src / "pkg" / f"m{i}.py").write_bytes(os.urandom(2000 + 300 * i))
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=MiB, pack_size=4 * MiB)
    add_directory(b, src)
    digest = b.finish()
    want = _job(src)
    got, _, _, state = _start(tmp_path, digest, "node-a", "record")
    assert got == want
    assert prof.publish_recorded(_config(tmp_path, "node-a"), str(state / "profile.json"))
    everything = {p: (src / p).read_bytes() for p in _files(src)}
    return store, digest, want, everything, prof.latest(store, digest)


def test_a_fresh_node_starts_from_the_hot_pack(tmp_path, recorded):
    store, digest, want, everything, profile = recorded
    pack = profile["pack"]
    hot = prof.hot_bytes(profile)
    assert pack["blocks"] * (64 << 10) >= hot["block_bytes"] > 0
    assert pack["bytes"] < hot["chunk_bytes"] / 2   # the blocks read, not their chunks
    got, every, figures, _ = _start(tmp_path, digest, "node-b", "fresh", wait_preread=True)
    assert got == want and every == everything
    pre = figures["prefetch"]
    assert pre["pack_blocks"] == pack["blocks"] and pre["pack_dropped_blocks"] == 0
    assert pre["fetched_chunks"] == 0 and pre["errors"] == 0   # no hot chunk fetched whole


def test_a_pack_failing_its_digest_is_never_used(tmp_path, recorded):
    store, digest, want, everything, profile = recorded
    path = store.path(profile["pack"]["digest"])
    assert path.exists()
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(blob))
    got, every, figures, _ = _start(tmp_path, digest, "node-c", "badpack")
    assert got == want and every == everything
    pre = figures["prefetch"]
    assert pre["pack_blocks"] == 0 and pre["errors"] == 1
    assert pre["fetched_chunks"] == len(profile["chunks"])   # the chunk path as before


def test_a_block_failing_its_block_digest_is_dropped(tmp_path, recorded):
    """The profile comes through a ref: a pack it names may be well formed and match its
    own digest, yet carry a wrong block. That block is dropped, the rest served."""
    store, digest, want, everything, profile = recorded
    blob = store.read(profile["pack"]["digest"])
    (n,) = hotpack._LEN.unpack_from(blob, len(hotpack.MAGIC))
    start = len(hotpack.MAGIC) + hotpack._LEN.size
    head, body = json.loads(blob[start:start + n]), blob[start + n:]
    first = head["blocks"][0]
    size = len(zstandard.ZstdDecompressor().decompress(body[:first[2]]))
    wrong = zstandard.ZstdCompressor().compress(bytes(size))   # the right size, zeros
    rest, first[2] = body[first[2]:], len(wrong)
    new_head = json.dumps(head).encode()
    forged = b"".join([hotpack.MAGIC, hotpack._LEN.pack(len(new_head)), new_head, wrong, rest])
    store.write(sha256_digest(forged), forged)
    prof.push(store, {**profile, "pack": {**profile["pack"], "digest": sha256_digest(forged),
                                          "bytes": len(forged)}})
    got, every, figures, _ = _start(tmp_path, digest, "node-d", "badblock")
    assert got == want and every == everything
    pre = figures["prefetch"]
    assert pre["pack_dropped_blocks"] == 1
    assert pre["pack_blocks"] == profile["pack"]["blocks"] - 1
    # the chunk of the dropped block, whole, by the prefetch: unless the job read it first
    # (on demand, then the prefetch finds it local); its bytes are right either way
    assert pre["fetched_chunks"] <= 1


def test_a_tree_without_a_block_table_keeps_the_chunk_path(tmp_path, need_root):
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "pkg").mkdir()
    for i in range(2):
        (src / "data" / f"shard-{i}.bin").write_bytes(os.urandom(3 * MiB))
    for i in range(12):
        (src / "pkg" / f"m{i}.py").write_bytes(os.urandom(1000))
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=MiB, block_size=3 * 4096)   # as trees built before
    add_directory(b, src)
    digest = b.finish()
    _, _, _, state = _start(tmp_path, digest, "node-a", "record")
    prof.publish_recorded(_config(tmp_path, "node-a"), str(state / "profile.json"))
    profile = prof.latest(store, digest)
    assert "pack" not in profile and profile["blocks"]   # blocks recorded, nothing to verify
    got, every, figures, _ = _start(tmp_path, digest, "node-b", "fresh", wait_preread=True)
    assert got == _job(src) and every == {p: (src / p).read_bytes() for p in _files(src)}
    assert figures["prefetch"]["fetched_chunks"] == len(profile["chunks"])
    assert figures["demand_chunks"] == 0


def test_warming_a_node_ahead_fetches_whole_chunks_a_start_reads_blocks(tmp_path, recorded):
    """``image prefetch`` (use_pack False) warms whole hot chunks, so a later mount finds
    them local; a start's prefetch takes the pack, and its reader serves a hot range from
    the blocks and a range beyond them from its chunk, each byte right."""
    from bootseer.store.client import StoreClient
    from bootseer.tree.prefetch import Prefetcher
    from bootseer.tree.reader import TreeReader
    store, digest, _, everything, profile = recorded
    for cache, use_pack in (("warm", False), ("start", True)):
        client = StoreClient.of(_config(tmp_path, cache))
        with client.lane() as f:
            reader = TreeReader(store, digest, f, client.cache)
            p = Prefetcher(reader, profile, use_pack=use_pack).start()
            p.wait(30)
            if not use_pack:
                assert p.stats["fetched_chunks"] == len(profile["chunks"])
                assert p.stats["pack_blocks"] == 0
                continue
            assert p.stats["fetched_chunks"] == 0 and reader.hot is not None
            shard = everything["data/shard-1.bin"]
            before = reader.counters["chunks_fetched"]
            assert reader.read("/data/shard-1.bin", 4096, 2 * MiB + 300) == \
                shard[2 * MiB + 300:2 * MiB + 4396]
            assert reader.counters["chunks_fetched"] == before   # from the pack's blocks
            assert reader.read("/data/shard-1.bin", 4096, 3 * MiB) == shard[3 * MiB:3 * MiB + 4096]
            assert reader.counters["chunks_fetched"] == before + 1   # cold: its chunk


@pytest.mark.parametrize("backend", ["erofs", "fuse"])
def test_a_page_fault_records_its_blocks_not_the_read_ahead_beyond(tmp_path, need_root,
                                                                     backend):
    """A loader's 4 KiB page fault near the end of a 1 MiB chunk: the kernel reads around
    it (128 KiB, as on a local image), and only those blocks are recorded, never the next
    chunk a wider read-ahead would reach; on the kernel path and on the FUSE tree view."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "lib.so").write_bytes(os.urandom(3 * MiB))
    b = TreeBuilder(open_store(str(tmp_path / "store")), chunk_size=MiB, pack_size=4 * MiB)
    add_directory(b, src)
    digest = b.finish()
    mp, state = tmp_path / "mnt", tmp_path / "state"
    mp.mkdir()
    config = _config(tmp_path, "node")
    config = dataclasses.replace(config, mount=MountConfig(backend=backend))
    handle, _, _ = mount_tree(config, digest, str(mp), str(state))
    try:
        assert handle.backend == {"erofs": "erofs-fuse-blob", "fuse": "fuse"}[backend]
        with open(mp / "lib.so", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[MiB - 64 * 1024:MiB - 64 * 1024 + 4096] == \
                (src / "lib.so").read_bytes()[MiB - 64 * 1024:MiB - 64 * 1024 + 4096]
        (state / "close-window").touch()
        deadline = time.time() + 20
        while not (state / "profile.json").exists() and time.time() < deadline:
            time.sleep(0.05)
    finally:
        handle.unmount()
    profile = json.loads((state / "profile.json").read_text())
    rows = [r for r in profile["chunks"] if r[3] == "/lib.so"]
    assert len(rows) == 1   # chunk 0 only: 1 MiB around the fault would reach chunk 1
    blocks = set(profile["blocks"][rows[0][0]])
    assert 15 in blocks and blocks <= {13, 14, 15}


def test_precision_counts_the_pack_blocks_fetched(tmp_path, recorded):
    """A fresh start that reads one of the pack's hot blocks: its precision is that
    block's share of the pack's bytes (whole chunks only, it was none: null)."""
    from bootseer.tree.session import TreeSession
    store, digest, _, everything, profile = recorded
    session = TreeSession(_config(tmp_path, "node-e"), digest, str(tmp_path / "state-e"),
                          profile=profile)
    session.prefetcher.wait(30)
    assert session.prefetcher.stats["pack_blocks"] == profile["pack"]["blocks"]
    shard = everything["data/shard-1.bin"]
    assert session.reader.read("/data/shard-1.bin", 4096, 2 * MiB + 300) == \
        shard[2 * MiB + 300:2 * MiB + 4396]
    session.finish()
    figures = json.loads((tmp_path / "state-e/figures.json").read_text())
    assert figures["prefetch"]["fetched_chunks"] == 0
    assert figures["precision"] == pytest.approx(
        (64 << 10) / prof.hot_bytes(profile)["block_bytes"])


def test_the_hot_set_torrent_is_what_a_start_taking_the_pack_fetches(tmp_path, recorded):
    """Published with a pack that leaves one hot chunk out (the publishing node no longer
    held it), the torrent is of that chunk alone: the set a start taking the pack asks its
    peers for, found under the same key."""
    from bootseer.config import PeersConfig
    from bootseer.peers.torrent import set_key
    from bootseer.peers.transfer import torrent_ref
    from bootseer.store.client import StoreClient
    from bootseer.tree.peer_source import set_items
    from bootseer.tree.prefetch import Prefetcher
    from bootseer.tree.reader import TreeReader
    store, digest, _, _, profile = recorded
    config = BootseerConfig(store=StoreConfig(url=str(tmp_path / "store")),
                            cache=CacheConfig(dir=str(tmp_path / "pub"), budget_bytes=1 << 30),
                            peers=PeersConfig(mode="on"))
    client = StoreClient.of(config)
    with client.lane() as f:   # the publishing node holds the hot chunks, but one
        Prefetcher(TreeReader(store, digest, f, client.cache), profile,
                   use_pack=False).start().wait(30)
    gone = profile["chunks"][0][0]
    client.cache.path(gone).unlink()
    (tmp_path / "p.json").write_text(json.dumps({**profile, "pack": None}))
    assert prof.publish_recorded(config, str(tmp_path / "p.json"))
    published = prof.latest(store, digest)
    client = StoreClient.of(_config(tmp_path, "node-t"))
    with client.lane() as f:   # a start: the pack, then what it leaves
        pre = Prefetcher(TreeReader(store, digest, f, client.cache), published).start()
        pre.wait(30)
    assert pre.stats["pack_blocks"] == published["pack"]["blocks"] > 0
    assert [r.digest for r in pre.plan] == [gone]
    assert store.get_ref(torrent_ref(set_key(set_items(pre.plan)))) is not None
