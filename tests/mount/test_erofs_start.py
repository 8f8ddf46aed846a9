"""The kernel path's blob server started before the mounting process loads the TOC
(``bootseer.tree.session``): used where the blob is served by FUSE, stopped where the
blob proves local or the tree cannot be loaded, never started again where the last mount
found the blob local, and refused when it serves another layout than the image's."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from bootseer.config import BootseerConfig, CacheConfig, MountConfig, StoreConfig
from bootseer.errors import BlobNotFound
from bootseer.store import open_store
from bootseer.tree import blob_mount
from bootseer.tree.build import TreeBuilder
from bootseer.tree.session import mount_tree

pytestmark = [pytest.mark.timeout(120), pytest.mark.fuse]


@pytest.fixture
def tree(tmp_path, need_root):
    b = TreeBuilder(open_store(str(tmp_path / "store")), chunk_size=1 << 20)
    b.add_dir("/d")
    for i in range(50):
        b.add_file(f"/d/f{i}", b"print(%d)\n" % i)
    b.add_file("/big", os.urandom(3 << 20))
    return b.finish()


def _config(tmp_path) -> BootseerConfig:
    return BootseerConfig(store=StoreConfig(url=str(tmp_path / "store")),
                          cache=CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30),
                          mount=MountConfig(backend="erofs"))


def _mount(config, digest, tmp_path, name):
    (tmp_path / name).mkdir()
    return mount_tree(config, digest, str(tmp_path / name), str(tmp_path / f"{name}-st"))[0]


def _no_server_left(blobfs) -> None:
    """The early server is stopped in the background: its mount and process go."""
    deadline = time.monotonic() + 30
    while os.path.ismount(blobfs) or multiprocessing.active_children():
        assert time.monotonic() < deadline, "the early blob server was left running"
        time.sleep(0.05)


def test_fuse_served_blob_uses_the_early_server_and_reads_right(tmp_path, tree):
    config = _config(tmp_path)
    handle = _mount(config, tree, tmp_path, "a")
    try:
        assert handle.backend == "erofs-fuse-blob"
        assert os.path.ismount(tmp_path / "a-st/blobfs")
        assert (tmp_path / "a-st" / blob_mount.SERVED_LAYOUT).exists()   # it started early
        assert (tmp_path / "a/d/f7").read_bytes() == b"print(7)\n"
        assert len((tmp_path / "a/big").read_bytes()) == 3 << 20
    finally:
        handle.unmount()
    _no_server_left(tmp_path / "a-st/blobfs")


def test_local_blob_stops_the_early_server_and_the_next_mount_starts_none(tmp_path, tree):
    config = _config(tmp_path)
    first = _mount(config, tree, tmp_path, "a")   # every chunk read: the next blob is local
    try:
        assert (tmp_path / "a/big").read_bytes() and (tmp_path / "a/d/f1").read_bytes()
        for i in range(50):
            (tmp_path / f"a/d/f{i}").read_bytes()
    finally:
        first.unmount()
    _no_server_left(tmp_path / "a-st/blobfs")
    local = _mount(config, tree, tmp_path, "b")
    try:
        assert local.backend == "erofs-local"
        _no_server_left(tmp_path / "b-st/blobfs")   # started before the blob proved local
        # ... and its session left the local mount's figures and wrote no profile
        figures = json.loads((tmp_path / "b-st/figures.json").read_text())
        assert figures["closed_by"] == "local blob"
        assert not (tmp_path / "b-st/profile.json").exists()
        assert (tmp_path / "b/d/f3").read_bytes() == b"print(3)\n"
    finally:
        local.unmount()
    again = _mount(config, tree, tmp_path, "c")
    try:
        assert again.backend == "erofs-local"
        assert not (tmp_path / "c-st/blobfs").exists()   # the hint: no server started at all
    finally:
        again.unmount()


def test_unknown_tree_stops_the_early_server(tmp_path, tree):
    config = _config(tmp_path)
    (tmp_path / "mp").mkdir()
    with pytest.raises(BlobNotFound):
        mount_tree(config, "sha256:" + "ab" * 32, str(tmp_path / "mp"), str(tmp_path / "st"))
    _no_server_left(tmp_path / "st/blobfs")
    assert not os.path.ismount(tmp_path / "mp")


def test_a_server_of_another_layout_is_refused(tmp_path):
    (tmp_path / blob_mount.SERVED_LAYOUT).write_text("0" * 64)
    with pytest.raises(ValueError, match="serves layout 000000000000"):
        blob_mount._check_served_layout(tmp_path, "1" * 64)
    (tmp_path / blob_mount.SERVED_LAYOUT).unlink()
    with pytest.raises(ValueError, match="serves layout none"):
        blob_mount._check_served_layout(tmp_path, "1" * 64)
