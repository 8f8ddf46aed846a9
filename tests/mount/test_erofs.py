"""The kernel path of lazy trees against the real kernel: EROFS metadata images written by
bootseer, mounted with mount(2) on a local blob and on a FUSE-served blob; every file's
bytes, mode, owner, times, links and xattrs compared with the source; fallback; faults."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
import subprocess
import time

import pytest

from bootseer.config import BootseerConfig, CacheConfig, MountConfig, StoreConfig
from bootseer.mount.handle import MountHandle
from bootseer.store import open_store
from bootseer.tree import format as fmt
from bootseer.tree.blob import BlobLayout
from bootseer.tree.build import TreeBuilder, add_directory
from bootseer.tree.session import PREFETCHED, mount_tree

pytestmark = [pytest.mark.timeout(120), pytest.mark.fuse]
MiB = 1 << 20


@pytest.fixture
def src(tmp_path, need_root):
    """Files of every size class, a directory whose dirents span several blocks,
    symlinks (one longer than fits inline), modes, owners, xattrs, hard links, identical
    content in two files (one chunk in the blob), a fifo and a device node."""
    root = tmp_path / "src"
    (root / "pkg/many").mkdir(parents=True)
    for i in range(400):   # 400 dirents of ~40 bytes: > 4 blocks
        (root / f"pkg/many/module_with_a_long_name_{i:04d}.py").write_bytes(b"x = %d\n" % i)
    big = os.urandom(3 * MiB + 17)
    (root / "pkg/big.bin").write_bytes(big)
    (root / "pkg/same.bin").write_bytes(big)
    os.link(root / "pkg/big.bin", root / "pkg/big-hard.bin")
    (root / "exactly-one-chunk").write_bytes(os.urandom(MiB))
    (root / "small").write_bytes(b"hello\n")
    (root / "empty").write_bytes(b"")
    for name in ("#hash", "+plus", "-dash"):   # sort before "." and "..": lookups still find them
        (root / "pkg/many" / name).write_bytes(name.encode())
    os.chmod(root / "small", 0o4751)
    os.chown(root / "small", 1234, 5678)
    os.setxattr(root / "small", "user.bootseer", b"v1")
    os.symlink("small", root / "link")
    os.symlink("d/" * 1500 + "far", root / "long-link")
    os.mkdir(root / "private", 0o700)
    os.chown(root / "private", 99, 99)
    os.mkfifo(root / "fifo")
    os.mknod(root / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.utime(root / "small", (1_600_000_000.25, 1_600_000_000.25))
    return root


@pytest.fixture
def tree(tmp_path, src):
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=MiB, pack_size=2 * MiB)
    add_directory(b, src)
    return store, b.finish(), b


def _config(tmp_path, backend="erofs", cache="cache") -> BootseerConfig:
    return BootseerConfig(store=StoreConfig(url=str(tmp_path / "store")),
                          cache=CacheConfig(dir=str(tmp_path / cache), budget_bytes=1 << 30),
                          mount=MountConfig(backend=backend))


def _mount(config, digest, tmp_path, name="mnt", **kw):
    mp = tmp_path / name
    mp.mkdir(exist_ok=True)
    state = tmp_path / f"{name}-state"
    handle, profile, _ = mount_tree(config, digest, str(mp), str(state), **kw)
    return handle, mp, state


def assert_same_tree(src, mp) -> int:
    """Every entry of ``src`` is in ``mp`` with the same type, mode, owner, mtime, size,
    bytes, link target, xattrs and device number; nothing more. Returns entries checked."""
    n = 0
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        there = os.path.join(mp, rel)
        assert sorted(os.listdir(there)) == sorted(dirnames + filenames), rel
        for name in ["."] + dirnames + filenames:
            a, b = os.path.join(dirpath, name), os.path.join(there, name)
            sa, sb = os.lstat(a), os.lstat(b)
            what = os.path.join(rel, name)
            assert (sa.st_mode, sa.st_uid, sa.st_gid) == (sb.st_mode, sb.st_uid, sb.st_gid), what
            assert abs(sa.st_mtime - sb.st_mtime) < 1e-6, what
            if stat.S_ISREG(sa.st_mode):
                assert sa.st_size == sb.st_size and sa.st_nlink == sb.st_nlink, what
                with open(a, "rb") as fa, open(b, "rb") as fb:
                    assert fa.read() == fb.read(), what
            elif stat.S_ISLNK(sa.st_mode):
                assert os.readlink(a) == os.readlink(b), what
            elif stat.S_ISCHR(sa.st_mode):
                assert sa.st_rdev == sb.st_rdev, what
            if not stat.S_ISLNK(sa.st_mode) and not stat.S_ISFIFO(sa.st_mode):
                for x in os.listxattr(a):
                    assert os.getxattr(b, x) == os.getxattr(a, x), (what, x)
            n += 1
    return n


def _fill_cache(config, digest):
    from bootseer.store.cache import NodeCache
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import TreeReader
    with Fetcher(config.fetch) as f:
        r = TreeReader(open_store(config.store.url, config), digest, f, NodeCache(config.cache))
        for c in r.all_chunks():
            r.chunk(c)


def test_erofs_on_fuse_blob_serves_the_tree_and_records_chunks(tmp_path, src, tree):
    store, digest, _ = tree
    config = _config(tmp_path)
    handle, mp, state = _mount(config, digest, tmp_path)
    try:
        assert handle.backend == "erofs-fuse-blob"
        assert assert_same_tree(src, mp) > 400
        st = os.stat(mp / "pkg/big.bin")
        assert st.st_ino == os.stat(mp / "pkg/big-hard.bin").st_ino and st.st_nlink == 2
        assert os.stat(mp / "small").st_mtime == 1_600_000_000.25
        with pytest.raises(OSError) as e:
            open(mp / "new", "w")
        assert e.value.errno == errno.EROFS
        # the server is a one-file FUSE mount; the tree is the kernel's EROFS
        mounts = open("/proc/self/mountinfo").read()
        assert f" {mp} " in mounts and " erofs " in mounts.split(f" {mp} ")[1].split("\n")[0]
        (state / "close-window").touch()
        deadline = time.time() + 10
        while not (state / "figures.json").exists() and time.time() < deadline:
            time.sleep(0.05)
    finally:
        handle.unmount()
    assert not os.path.ismount(mp) and not handle.proc.is_alive()
    profile = json.loads((state / "profile.json").read_text())
    toc = fmt.decode(store.read(digest))
    chunks = {c.digest for e in toc.entries for c in e.chunks or ()}
    recorded = {row[0] for row in profile["chunks"]}
    assert recorded and recorded <= chunks   # profiles stay per chunk digest
    # the profile leaves the blob's layout (and the stored metadata image) as they were
    assert BlobLayout(toc).key == toc.erofs["layout"]
    from bootseer.tree import profile as prof
    from bootseer.tree.blob_mount import PREREAD
    prof.push(store, profile)
    handle, mp, state = _mount(_config(tmp_path, cache="cache2"), digest, tmp_path, "mnt2")
    try:
        deadline = time.time() + 20   # prefetched, then pre-read through the FUSE blob
        while not (state / PREREAD).exists() and time.time() < deadline:
            time.sleep(0.05)
        assert (state / PREFETCHED).exists() and (state / PREREAD).exists()
        assert assert_same_tree(src, mp) > 400
    finally:
        handle.unmount()


def _read_like_a_job(mp) -> bytes:
    """Parts of large files (a header, a slice in the middle, not chunk-aligned) and a few
    small files: the reads a start makes of a model's shards and its packages."""
    out = []
    for name in ("shard-0.bin", "shard-1.bin"):
        with open(mp / "data" / name, "rb") as f:
            for offset, size in ((0, 64 << 10), (3 * MiB + 100, 2 * MiB)):
                f.seek(offset)
                out.append(f.read(size))
    out += [(mp / "pkg" / f"m{i}.py").read_bytes() for i in range(0, 30, 3)]
    return b"".join(out)


def _close_window(handle, state) -> dict:
    (state / "close-window").touch()
    deadline = time.time() + 10
    while not (state / "figures.json").exists() and time.time() < deadline:
        time.sleep(0.05)
    handle.unmount()
    return json.loads((state / "figures.json").read_text())


def test_profile_recorded_on_the_kernel_path_prefetched_then_replayed_needs_no_store(
        tmp_path, need_root):
    """Record a start on the kernel path, publish its profile, start again on a fresh node
    cache: once the hot chunks are prefetched and pre-read, the same reads wait for no
    chunk from the store, and the pre-read itself made the job read nothing more (its
    read-ahead ran into the next, cold chunk of a file: fetched on demand, a stall)."""
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "pkg").mkdir()
    for i in range(2):
        (src / "data" / f"shard-{i}.bin").write_bytes(os.urandom(10 * MiB))
    for i in range(30):
        (src / "pkg" / f"m{i}.py").write_bytes(os.urandom(3000 + 200 * i))
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=MiB, pack_size=4 * MiB)
    add_directory(b, src)
    digest = b.finish()
    want = _read_like_a_job(src)

    handle, mp, state = _mount(_config(tmp_path), digest, tmp_path, "record")
    assert handle.backend == "erofs-fuse-blob"
    assert _read_like_a_job(mp) == want
    recorded = _close_window(handle, state)
    assert recorded["demand_chunks"] > 0   # a fresh node: nothing was local
    profile = json.loads((state / "profile.json").read_text())
    from bootseer.tree import profile as prof
    from bootseer.tree.blob_mount import PREREAD
    # the hot set at the granularity the kernel read: each shard's 64 KiB header is the
    # kernel's first read-ahead window of its chunk (a few blocks), not the whole chunk
    hot = prof.hot_bytes(profile)
    assert recorded["read_block_bytes"] == hot["block_bytes"] < hot["chunk_bytes"]
    assert any(len(b) < MiB // profile["block_size"] for b in profile["blocks"].values())
    prof.push(store, profile)

    handle, mp, state = _mount(_config(tmp_path, cache="fresh-node"), digest, tmp_path,
                               "replay")
    deadline = time.time() + 20
    while not (state / PREREAD).exists() and time.time() < deadline:
        time.sleep(0.02)
    assert (state / PREREAD).exists()
    assert _read_like_a_job(mp) == want
    replayed = _close_window(handle, state)
    assert replayed["demand_chunks"] == 0 and replayed["stall_s"] == 0
    assert replayed["coverage"] == 1.0
    # no chunk beyond the recorded ones was read (nor will be in the next profile)
    again = json.loads((state / "profile.json").read_text())
    assert {r[0] for r in again["chunks"]} == {r[0] for r in profile["chunks"]}


def test_local_blob_when_every_chunk_is_local(tmp_path, src, tree):
    store, digest, _ = tree
    config = _config(tmp_path)
    _fill_cache(config, digest)
    handle, mp, state = _mount(config, digest, tmp_path)
    try:
        assert handle.backend == "erofs-local" and handle.pid is None and handle.proc.is_alive()
        assert assert_same_tree(src, mp) > 400
        assert (state / PREFETCHED).exists() and (state / "figures.json").exists()
        blobs = list((tmp_path / "cache/erofs/trees").glob("*.blob"))
        metas = list((tmp_path / "cache/erofs").glob("*.meta"))
        assert len(blobs) == 1 and len(metas) == 1
        if shutil.which("fsck.erofs"):
            r = subprocess.run(["fsck.erofs", f"--device={blobs[0]}", str(metas[0])],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
    finally:
        handle.unmount()
    assert not os.path.ismount(mp) and not handle.proc.is_alive()


def test_corrupt_local_blob_is_refused_before_mounting(tmp_path, src, tree, caplog):
    store, digest, _ = tree
    config = _config(tmp_path)
    _fill_cache(config, digest)
    handle, mp, _ = _mount(config, digest, tmp_path)
    handle.unmount()
    blob = next((tmp_path / "cache/erofs/trees").glob("*.blob"))
    meta = next((tmp_path / "cache/erofs").glob("*.meta"))
    good, good_meta = blob.read_bytes(), meta.read_bytes()
    for path, at in ((blob, 5000), (meta, 4096 + 10)):
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(bytes([path.read_bytes()[at] ^ 0xFF]))
    handle, mp, _ = _mount(config, digest, tmp_path, "again")
    try:   # refused, removed, and made again (the blob from the verified node cache)
        assert "fails verification" in caplog.text and "does not match its sum" in caplog.text
        assert meta.read_bytes() == good_meta
        assert handle.backend == "erofs-local" and blob.read_bytes() == good
        assert assert_same_tree(src, mp) > 400
    finally:
        handle.unmount()
    blob.write_bytes(b"\0" * len(good))
    # no chunk local any more: the FUSE blob serves. A blob server a mount started early
    # and found unneeded is stopped in the background and may still put a verified chunk
    # in the node cache meanwhile: remove until nothing comes back.
    for _ in range(100):
        try:
            shutil.rmtree(tmp_path / "cache/data")
            break
        except OSError:
            time.sleep(0.05)
    handle, mp, _ = _mount(config, digest, tmp_path, "third")
    try:
        assert handle.backend == "erofs-fuse-blob" and not blob.exists()
        assert assert_same_tree(src, mp) > 400
    finally:
        handle.unmount()


def test_making_room_for_a_blob_never_removes_a_live_mounts(tmp_path, need_root):
    """Half the budget holds one tree's blob: a second tree mounted while the first is
    still keeps the first's blob (its mount uses it); once both are unmounted, a third
    tree's blob takes the room of both."""
    store = open_store(str(tmp_path / "store"))
    trees = []
    for name in ("a", "b", "c"):
        src = tmp_path / f"src-{name}"
        src.mkdir()
        (src / "data.bin").write_bytes(os.urandom(2 * MiB + 5))
        b = TreeBuilder(store, chunk_size=MiB, pack_size=2 * MiB)
        add_directory(b, src)
        trees.append(b.finish())
    size = BlobLayout(fmt.decode(store.read(trees[0]))).size
    config = BootseerConfig(store=StoreConfig(url=str(tmp_path / "store")),
                            cache=CacheConfig(dir=str(tmp_path / "cache"),
                                              budget_bytes=2 * size + 8192),
                            mount=MountConfig(backend="erofs"))
    blobs = tmp_path / "cache/erofs/trees"
    handles = []
    try:
        for name, digest in zip("ab", trees[:2], strict=True):   # c comes after
            _fill_cache(config, digest)
            handle, mp, _ = _mount(config, digest, tmp_path, f"mnt-{name}")
            handles.append(handle)
            assert handle.backend == "erofs-local"
            assert len((mp / "data.bin").read_bytes()) == 2 * MiB + 5
        assert len(list(blobs.glob("*.blob"))) == 2   # a's blob stays while a is mounted
    finally:
        for handle in handles:
            handle.unmount()
    _fill_cache(config, trees[2])
    handle, _, _ = _mount(config, trees[2], tmp_path, "mnt-c")
    handle.unmount()
    assert len(list(blobs.glob("*.blob"))) == 1


# a blob assembly from the node cache that stops after its first chunk, its temporary
# written: says "writing" and waits to be killed
_STUCK_ASSEMBLY = """
import sys, time
from bootseer.config import CacheConfig
from bootseer.store import open_store
from bootseer.store.cache import NodeCache
from bootseer.tree import format as fmt
from bootseer.tree.blob import BlobLayout, assemble
store, digest, cache_dir, dest = sys.argv[1:]
cache = NodeCache(CacheConfig(dir=cache_dir, budget_bytes=1 << 30))
class Stuck:
    served = 0
    def get(self, digest, size):
        self.served += 1
        if self.served == 2:
            print("writing", flush=True)
            time.sleep(600)
        return cache.get(digest, size)
assemble(BlobLayout(fmt.decode(open_store(store).read(digest))), Stuck(), dest)
"""


def _stuck_assembly(config, digest, dest) -> subprocess.Popen:
    import sys
    p = subprocess.Popen([sys.executable, "-c", _STUCK_ASSEMBLY, config.store.url, digest,
                          config.cache.dir, str(dest)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "writing\n"
    return p


def test_a_killed_blob_builds_temporaries_go_at_the_next_mount_a_live_ones_stay(
        tmp_path, src, tree):
    """A blob assembly SIGKILLed midway leaves its temporary in ``erofs/trees``: the next
    mount on the node removes it, and never the temporary of one still writing."""
    import signal
    store, digest, _ = tree
    config = _config(tmp_path)
    _fill_cache(config, digest)
    blobs = tmp_path / "cache/erofs/trees"
    blobs.mkdir(parents=True)
    killed = _stuck_assembly(config, digest, blobs / "other-tree.blob")
    dead_ones = set(os.listdir(blobs))
    live = _stuck_assembly(config, digest, blobs / "third-tree.blob")
    try:
        live_ones = set(os.listdir(blobs)) - dead_ones
        assert dead_ones and live_ones
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        handle, mp, _ = _mount(config, digest, tmp_path)
        handle.unmount()
        assert handle.backend == "erofs-local"
        mine = {p.name for p in blobs.glob("*.blob")}
        assert set(os.listdir(blobs)) == mine | live_ones
    finally:
        live.kill()
        live.wait()
    handle, mp, _ = _mount(config, digest, tmp_path, "again")   # the blob is there already
    handle.unmount()
    assert set(os.listdir(blobs)) == mine


def test_corrupt_chunk_in_the_store_is_eio_for_its_range_only(tmp_path, src, tree):
    store, digest, b = tree
    toc = fmt.decode(store.read(digest))
    big = next(e for e in toc.entries if e.path.startswith("/pkg/big") and e.chunks)
    ref = big.chunks[1]
    pack = store.path(b.packs[ref.pack])
    os.chmod(pack, 0o644)
    data = bytearray(pack.read_bytes())
    data[ref.offset + ref.stored // 2] ^= 0xFF
    pack.write_bytes(bytes(data))
    handle, mp, _ = _mount(_config(tmp_path), digest, tmp_path)
    want = (src / "pkg/big.bin").read_bytes()
    try:
        fd = os.open(mp / "pkg/big.bin", os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, 0) == want[:4096]
            with pytest.raises(OSError) as e:
                os.pread(fd, 4096, MiB + 4096)
            assert e.value.errno == errno.EIO
            assert os.pread(fd, 4096, 2 * MiB) == want[2 * MiB:2 * MiB + 4096]
        finally:
            os.close(fd)
        assert (mp / "small").read_bytes() == b"hello\n"
    finally:
        handle.unmount()


@pytest.mark.parametrize("local", [False, True])
def test_unmount_while_a_file_is_open_detaches_lazily(tmp_path, src, tree, local):
    store, digest, _ = tree
    config = _config(tmp_path)
    if local:
        _fill_cache(config, digest)
    handle, mp, state = _mount(config, digest, tmp_path)
    f = open(mp / "pkg/big.bin", "rb")
    try:
        assert f.read(4096) == (src / "pkg/big.bin").read_bytes()[:4096]
        t0 = time.monotonic()
        handle.unmount()
        assert time.monotonic() - t0 < 10
        assert not os.path.ismount(mp) and not os.path.ismount(state / "blobfs")
        assert not handle.proc.is_alive()
    finally:
        f.close()
    handle.unmount()   # idempotent


def test_backend_fuse_or_no_kernel_support_uses_the_fuse_tree_view(tmp_path, src, tree,
                                                                    monkeypatch, caplog):
    from bootseer.mount import choose as m
    from bootseer.mount.erofs import kernel
    from bootseer.mount.erofs.kernel import ErofsMountError
    store, digest, _ = tree
    handle, mp, _ = _mount(_config(tmp_path, backend="fuse"), digest, tmp_path)
    try:
        assert isinstance(handle, MountHandle)
        assert (mp / "pkg/big.bin").read_bytes() == (src / "pkg/big.bin").read_bytes()
    finally:
        handle.unmount()
    monkeypatch.setattr(kernel, "availability", lambda: "the kernel has no EROFS (test)")
    monkeypatch.setattr(m, "_said", set())

    def tree_backend(config) -> str:
        return m.choose(config, m.What.TREE).value
    with caplog.at_level(logging.INFO, logger="bootseer.mount"):
        assert tree_backend(_config(tmp_path, backend="auto")) == "fuse"
        assert tree_backend(_config(tmp_path, backend="auto")) == "fuse"
    said = [r for r in caplog.records if "EROFS path unavailable" in r.getMessage()]
    assert len(said) == 1 and "test" in said[0].getMessage()
    with pytest.raises(ErofsMountError, match="BOOTSEER_MOUNT_BACKEND=erofs"):
        tree_backend(_config(tmp_path, backend="erofs"))


def test_store_killed_while_the_blob_server_answers_is_eio_not_a_hang(need_fuse, nginx_factory,
                                                                       tmp_path):
    """The store (nginx serving the store layout) dies under a mounted tree: what is
    local still reads, an uncached range fails with EIO after the retries, and the mount
    stays consistent (listing, stat, the cached file again)."""
    from bootseer.config import FetchConfig
    local = open_store(str(tmp_path / "store"))
    b = TreeBuilder(local, chunk_size=64 << 10)
    a, other = os.urandom(200_000), os.urandom(200_000)
    b.add_file("/a.bin", a)
    b.add_file("/sub/b.bin", other)
    digest = b.finish()
    server = nginx_factory(tmp_path / "store")
    config = BootseerConfig(
        store=StoreConfig(url=server.url),
        cache=CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30),
        fetch=FetchConfig(retries=2, backoff_s=0.05, timeout_s=2, deadline_s=10),
        mount=MountConfig(backend="erofs"))
    handle, mp, _ = _mount(config, digest, tmp_path)
    try:
        assert handle.backend == "erofs-fuse-blob"
        assert (mp / "a.bin").read_bytes() == a
        server.stop()
        t = time.monotonic()
        with pytest.raises(OSError) as e:
            (mp / "sub/b.bin").read_bytes()
        assert e.value.errno == errno.EIO and time.monotonic() - t < 30
        assert sorted(os.listdir(mp)) == ["a.bin", "sub"] and os.stat(mp / "sub/b.bin").st_size
        assert (mp / "a.bin").read_bytes() == a
    finally:
        handle.unmount()
    assert not os.path.ismount(mp)


def test_cache_on_tmpfs_keeps_the_image_elsewhere_or_falls_back(tmp_path, src, tree):
    """The kernel mounts no EROFS image from tmpfs (ENOTBLK): with the node cache there,
    the image goes to the mount's state directory; with both there, ``auto`` serves the
    FUSE tree view and a forced ``erofs`` says why."""
    from bootseer.mount.erofs.kernel import ErofsMountError
    store, digest, _ = tree
    ram = tmp_path / "ram"
    ram.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(ram)], check=True)
    try:
        config = BootseerConfig(store=StoreConfig(url=str(tmp_path / "store")),
                                cache=CacheConfig(dir=str(ram / "cache"), budget_bytes=1 << 30),
                                mount=MountConfig(backend="erofs"))
        handle, mp, state = _mount(config, digest, tmp_path)
        try:
            assert handle.backend == "erofs-fuse-blob" and list(state.glob("*.meta"))
            assert (mp / "pkg/big.bin").read_bytes() == (src / "pkg/big.bin").read_bytes()
        finally:
            handle.unmount()
        (tmp_path / "mnt2").mkdir()
        with pytest.raises(ErofsMountError, match="tmpfs"):
            mount_tree(config, digest, str(tmp_path / "mnt2"), str(ram / "state"))
        # the blob server, started while the image was being written, is gone again
        assert not os.path.ismount(tmp_path / "mnt2")
        assert not os.path.ismount(ram / "state/blobfs")
        auto = BootseerConfig(store=config.store, cache=config.cache,
                              mount=MountConfig(backend="auto"))
        handle, _, _ = mount_tree(auto, digest, str(tmp_path / "mnt2"), str(ram / "state2"))
        try:
            assert isinstance(handle, MountHandle)
            assert (tmp_path / "mnt2/small").read_bytes() == b"hello\n"
        finally:
            handle.unmount()
    finally:
        subprocess.run(["umount", "-l", str(ram)], check=True)
