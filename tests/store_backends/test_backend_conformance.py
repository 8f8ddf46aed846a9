"""The store contract, run against every backend kind (see conftest.KINDS)."""

from __future__ import annotations

import io
import os

import pytest

from bootseer.errors import (
    BlobNotFound,
    DigestMismatch,
    FetchError,
    InvalidDigest,
    RangeError,
    StoreError,
)
from bootseer.store import Backend, sha256_digest

pytestmark = pytest.mark.timeout(120)
DATA = os.urandom(300_000)
DIGEST = sha256_digest(DATA)
MISSING = "sha256:" + "0" * 64


def test_is_a_backend(store):
    assert isinstance(store.reader, Backend)
    assert store.reader.host and store.reader.url
    assert store.reader.writable is (store.kind != "http")


def test_blob_roundtrip_and_ranges(store):
    w, r = store.writer, store.reader
    assert w.write(DIGEST, DATA) is True
    assert w.write(DIGEST, DATA) is False  # already there
    assert r.exists(DIGEST) and r.stat(DIGEST) == len(DATA)
    assert r.read(DIGEST) == DATA
    assert r.read(DIGEST, 1000, 2000) == DATA[1000:2000]
    assert r.read(DIGEST, 299_990) == DATA[299_990:]
    assert r.read(DIGEST, 299_990, 400_000) == DATA[299_990:]  # clipped at the end
    assert r.read(DIGEST, 10, 10) == b""
    if store.kind == "oci":  # the registry lists only blobs that tagged manifests reference
        assert DIGEST not in set(r.list())
        w.set_ref("keep", DIGEST)
    assert DIGEST in set(r.list())


def test_streamed_write_from_a_file_object(store):
    data = os.urandom(2_500_000)
    d = sha256_digest(data)
    assert store.writer.write(d, io.BytesIO(data), len(data)) is True
    assert store.reader.read(d) == data


def test_empty_blob(store):
    d = sha256_digest(b"")
    store.writer.write(d, b"")
    assert store.reader.stat(d) == 0 and store.reader.read(d) == b""


def test_unknown_digest(store):
    r = store.reader
    assert not r.exists(MISSING)
    with pytest.raises(BlobNotFound) as e:
        r.read(MISSING)
    assert e.value.digest == MISSING and MISSING in str(e.value)
    with pytest.raises(BlobNotFound):
        r.stat(MISSING)
    with pytest.raises(InvalidDigest):
        r.read("md5:abc")


def test_mismatched_bytes_are_never_stored(store):
    w = store.writer
    with pytest.raises(DigestMismatch) as e:
        w.write(MISSING, b"not these bytes")
    assert e.value.digest == MISSING
    with pytest.raises(DigestMismatch):
        w.write(MISSING, io.BytesIO(os.urandom(100_000)))
    assert not store.reader.exists(MISSING)
    assert MISSING not in set(store.reader.list())


def test_range_past_the_end(store):
    store.writer.write(DIGEST, DATA)
    with pytest.raises(RangeError) as e:
        store.reader.read(DIGEST, len(DATA) + 10)
    assert e.value.offset == len(DATA) + 10


def test_refs(store):
    w, r = store.writer, store.reader
    w.write(DIGEST, DATA)
    other = sha256_digest(b"other")
    w.write(other, b"other")
    assert w.set_ref("jobs/a/profile", DIGEST, exclusive=True) is True
    assert w.set_ref("jobs/a/profile", other, exclusive=True) is False
    assert r.get_ref("jobs/a/profile") == DIGEST
    assert w.set_ref("jobs/a/profile", other) is True  # plain set overwrites
    assert r.get_ref("jobs/a/profile") == other
    w.set_ref("jobs/b", DIGEST)
    w.set_ref("images/x.y_z-1", DIGEST)
    assert list(r.list_refs("jobs/")) == ["jobs/a/profile", "jobs/b"]
    assert set(r.list_refs()) == {"jobs/a/profile", "jobs/b", "images/x.y_z-1"}
    assert r.get_ref("jobs/none") is None
    w.delete_ref("jobs/a/profile")
    w.delete_ref("jobs/a/profile")  # absent: no error
    assert r.get_ref("jobs/a/profile") is None


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/abs", "a//b", "a/./b", "sp ace",
                                 ".hidden", "a/..", ""])
def test_bad_ref_names(store, bad):
    with pytest.raises(StoreError, match="invalid ref name"):
        store.writer.set_ref(bad, DIGEST)
    with pytest.raises(StoreError, match="invalid ref name"):
        store.reader.get_ref(bad)


def test_read_into(store):
    store.writer.write(DIGEST, DATA)
    buf = bytearray(len(DATA))
    view = memoryview(buf)
    assert store.reader.read_into(DIGEST, 0, view[:100_000]) == 100_000
    assert store.reader.read_into(DIGEST, 100_000, view[100_000:]) == len(DATA) - 100_000
    assert bytes(buf) == DATA
    with pytest.raises((RangeError, FetchError)):
        store.reader.read_into(DIGEST, len(DATA) - 10, bytearray(20))
    with pytest.raises(BlobNotFound):
        store.reader.read_into(MISSING, 0, bytearray(10))
