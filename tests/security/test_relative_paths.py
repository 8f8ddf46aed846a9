"""Issue 18 item 9: a relative store or cache directory is made absolute when the settings
are loaded, so a mount's server (which does not run in our directory) reads the same
places: a mount made from a relative store serves its uncached reads."""

from __future__ import annotations

import os

import pytest

from bootseer.config import BootseerConfig
from bootseer.store import open_store
from bootseer.tree.build import TreeBuilder

pytestmark = pytest.mark.timeout(120)


def test_relative_settings_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = BootseerConfig.from_env({"BOOTSEER_STORE_URL": "rel/store",
                                 "BOOTSEER_CACHE_DIR": "./cache"})
    assert c.store.url == str(tmp_path / "rel/store")
    assert c.cache.dir == str(tmp_path / "cache")
    c = BootseerConfig.from_env({}, overrides={"store": {"url": "file://rel"}})
    assert c.store.url == str(tmp_path / "rel")
    for url in ("s3://bucket/x", "http://host/x", "oci://127.0.0.1:5000/r", "/abs/store"):
        assert BootseerConfig.from_env({}, overrides={"store": {"url": url}}).store.url == url


def test_a_mount_from_a_relative_store_reads_uncached(tmp_path, monkeypatch, need_fuse):
    from bootseer.image.session import mount_image
    data = os.urandom(300_000)
    builder = TreeBuilder(open_store(str(tmp_path / "store")))
    builder.add_file("/data.bin", data)
    tree = builder.finish()
    (tmp_path / "mnt").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BOOTSEER_CACHE_DIR", "cache")
    config = BootseerConfig.from_env(overrides={"store": {"url": "store"}})
    handle, *_ = mount_image(config, tree, "mnt", str(tmp_path / "state"), record=False,
                             prefetch=False)
    try:
        assert (tmp_path / "mnt/data.bin").read_bytes() == data
    finally:
        handle.unmount()
    assert (tmp_path / "cache").is_dir()
