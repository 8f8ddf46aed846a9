"""The EROFS metadata image made once, when the tree is built, and named in its TOC: a
fresh node mounts that one (it writes none), one that fails its digest is never mounted
(the node writes its own), and a tree built before images were stored still mounts.
Real store, real FUSE blob server, real EROFS kernel mounts."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from bootseer.store import open_store
from bootseer.tree import format as fmt
from bootseer.tree import meta_image
from bootseer.tree.blob import BlobLayout
from bootseer.tree.build import TreeBuilder, add_directory
from tests.mount.test_erofs import _config, _mount, assert_same_tree

pytestmark = [pytest.mark.timeout(120), pytest.mark.fuse]
MiB = 1 << 20


@pytest.fixture
def src(tmp_path, need_root):
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    for i in range(50):
        (root / f"pkg/mod_{i:02d}.py").write_bytes(b"x = %d\n" % i)
    (root / "pkg/big.bin").write_bytes(os.urandom(2 * MiB + 5))
    os.symlink("pkg/big.bin", root / "link")
    return root


def _build(tmp_path, src, **finish) -> tuple:
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=MiB)
    add_directory(b, src)
    digest = b.finish(**finish)
    return store, digest, fmt.decode(store.read(digest), digest)


def _cached_images(config) -> list[bytes]:
    d = os.path.join(config.cache.dir, "erofs")
    return [open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))
            if n.endswith(".meta")]


def _no_local_writes(monkeypatch) -> None:
    def refuse(*a, **kw):
        raise AssertionError("a metadata image was written at the start")
    monkeypatch.setattr(meta_image, "write_image", refuse)


def test_a_fresh_node_mounts_the_stored_image_and_writes_none(tmp_path, src, monkeypatch,
                                                               caplog):
    store, digest, toc = _build(tmp_path, src)
    stored = store.read(toc.erofs["images"]["tree"])
    _no_local_writes(monkeypatch)
    config = _config(tmp_path)
    with caplog.at_level(logging.INFO, logger="bootseer"):
        handle, mp, _ = _mount(config, digest, tmp_path)
    try:
        assert handle.backend == "erofs-fuse-blob"
        assert assert_same_tree(src, mp) > 50
    finally:
        handle.unmount()
    assert "its stored metadata image" in caplog.text and "writing it here" not in caplog.text
    assert _cached_images(config) == [stored]   # kept in the node's image cache, with its sum


def test_a_stored_image_failing_its_digest_is_never_mounted(tmp_path, src, caplog):
    store, digest, toc = _build(tmp_path, src)
    # the store's copy replaced by a well-formed image of another tree on the same blob
    # (one file renamed): mounted, it would show that tree
    shutil.copytree(src, tmp_path / "other-src", symlinks=True)
    (tmp_path / "other-src/pkg/mod_00.py").rename(tmp_path / "other-src/pkg/evil.py")
    (tmp_path / "other").mkdir()
    _, _, other = _build(tmp_path / "other", tmp_path / "other-src")
    assert other.erofs["layout"] == toc.erofs["layout"]
    path = store.path(toc.erofs["images"]["tree"])
    os.chmod(path, 0o644)
    path.write_bytes(open_store(str(tmp_path / "other/store")).read(other.erofs["images"]["tree"]))
    config = _config(tmp_path)
    with caplog.at_level(logging.INFO, logger="bootseer"):
        handle, mp, _ = _mount(config, digest, tmp_path)
    try:
        assert not os.path.exists(mp / "pkg/evil.py")
        assert assert_same_tree(src, mp) > 50
    finally:
        handle.unmount()
    assert caplog.text.count("stored metadata image cannot be used") == 1
    assert _cached_images(config) == [meta_image.image_of(digest, toc, BlobLayout(toc))]


def test_a_tree_without_a_stored_image_still_mounts(tmp_path, src, caplog):
    store, digest, toc = _build(tmp_path, src, erofs=())   # as trees were built before
    assert toc.erofs is None and b'"erofs"' not in fmt.encode(toc)
    config = _config(tmp_path)
    with caplog.at_level(logging.INFO, logger="bootseer"):
        handle, mp, _ = _mount(config, digest, tmp_path)
    try:
        assert handle.backend == "erofs-fuse-blob"
        assert assert_same_tree(src, mp) > 50
    finally:
        handle.unmount()
    assert caplog.text.count("names no stored tree metadata image") == 1


def test_a_node_that_refuses_stored_images_writes_its_own(tmp_path, src, caplog):
    from dataclasses import replace
    store, digest, toc = _build(tmp_path, src)
    config = _config(tmp_path)
    config = replace(config, mount=replace(config.mount, stored_metadata=False))
    with caplog.at_level(logging.INFO, logger="bootseer"):
        handle, mp, _ = _mount(config, digest, tmp_path)
    try:
        assert assert_same_tree(src, mp) > 50
    finally:
        handle.unmount()
    assert "mount.stored_metadata is off" in caplog.text
    assert "its stored metadata image" not in caplog.text
