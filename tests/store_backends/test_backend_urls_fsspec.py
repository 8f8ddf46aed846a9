"""URL -> backend selection and the fsspec boundary (memory://, a fake hdfs://, forced
fsspec+file://)."""

from __future__ import annotations

import os

import pytest

from bootseer.config import BootseerConfig
from bootseer.errors import ConfigError, DigestMismatch
from bootseer.store import open_store, sha256_digest
from bootseer.store.backends.fsspec_store import FsspecBackend
from bootseer.store.backends.http import HttpBackend
from bootseer.store.backends.local import LocalBackend
from bootseer.store.backends.oci import OciBackend
from tests.store_backends.fakes import register_fake_hdfs

DATA = os.urandom(50_000)
DIGEST = sha256_digest(DATA)


def test_schemes_pick_backends(tmp_path, monkeypatch):
    assert isinstance(open_store(str(tmp_path / "a")), LocalBackend)
    assert isinstance(open_store(f"file://{tmp_path}/b"), LocalBackend)
    assert isinstance(open_store("http://127.0.0.1:1/s"), HttpBackend)
    assert isinstance(open_store("oci://127.0.0.1:1/r/s"), OciBackend)
    assert isinstance(open_store("memory://x"), FsspecBackend)
    forced = open_store(f"fsspec+file://{tmp_path}/c")
    assert isinstance(forced, FsspecBackend)
    forced.write(DIGEST, DATA)
    # the same layout: a local backend over the directory sees what fsspec wrote
    assert LocalBackend(tmp_path / "c").read(DIGEST) == DATA
    monkeypatch.setenv("BOOTSEER_STORE_URL", str(tmp_path / "env"))
    b = open_store()
    assert isinstance(b, LocalBackend) and b.url == str(tmp_path / "env")


def test_unknown_scheme_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown scheme 'nosuch'.*known schemes are.*oci"):
        open_store("nosuch://x/y")


def test_missing_driver_gives_an_install_hint():
    try:
        import s3fs  # noqa: F401
        pytest.skip("s3fs is installed here")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match=r"pip install 'bootseer\[s3\]'"):
        open_store("s3://bucket/store")


def test_hdfs_urls_route_through_fsspec():
    fake = register_fake_hdfs()
    try:
        b = open_store("hdfs://namenode:8020/user/x/store", BootseerConfig())
        assert isinstance(b, FsspecBackend) and b.host == "namenode:8020"
        assert b.url == "hdfs://namenode:8020/user/x/store"
        b.write(DIGEST, DATA)
        assert b.read(DIGEST, 5, 15) == DATA[5:15]
        assert any(p.endswith(DIGEST[7:]) for p in fake.store)
        assert not [p for p in fake.store if ".tmp-" in p]
    finally:
        fake.store.clear()


def test_fsspec_failed_write_leaves_no_temp():
    b = open_store("memory://failwrite")
    with pytest.raises(DigestMismatch):
        b.write("sha256:" + "2" * 64, DATA)
    assert not [p for p in b.fs.find(b.root) if ".tmp-" in p]
