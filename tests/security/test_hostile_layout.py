"""Issue 18 item 10: ``image convert`` checks every digest it reads from a layout before it
names a file (``sha256:../../x`` never reads a host file) and verifies every blob against
its digest (layers as they stream); a hostile layout is refused and publishes nothing."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import threading

import pytest

from bootseer.errors import InvalidDigest
from bootseer.image import convert
from bootseer.store import open_store
from bootseer.store.fetch import Fetcher
from bootseer.tree.reader import TreeReader
from tests.image.test_image import tar_layer

pytestmark = pytest.mark.timeout(60)
LAYER = tar_layer([("etc", None, "d"), ("etc/os-release", b"ID=ok\n", "f")])


def put(root, data: bytes, algo: str = "sha256") -> dict:
    h = hashlib.new(algo, data).hexdigest()
    (root / "blobs" / algo).mkdir(parents=True, exist_ok=True)
    (root / "blobs" / algo / h).write_bytes(data)
    return {"digest": f"{algo}:{h}", "size": len(data)}


def layout(root, layers: list[bytes], *, layer_algo: str = "sha256", edit=None):
    """An OCI layout of ``layers``; ``edit(manifest)`` may forge its descriptors."""
    config = put(root, json.dumps({"architecture": "amd64", "os": "linux",
                                   "config": {"Env": ["PATH=/bin"]}}).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                            **put(root, layer, layer_algo)} for layer in layers]}
    if edit:
        edit(manifest)
    m = put(root, json.dumps(manifest).encode())
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", **m}]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def refused(tmp_path, src, match: str) -> None:
    store = open_store(str(tmp_path / "store"))
    with pytest.raises(convert.ConvertError, match=match) as e:
        convert.convert(str(src), store)
    assert "\n" not in str(e.value)
    assert list(store.list_refs()) == []   # nothing published under any name


def test_a_verified_layout_converts_with_sha256_sha512_and_gzip(tmp_path):
    src = layout(tmp_path / "img", [LAYER, gzip.compress(tar_layer([("bin", None, "d"),
                                                                    ("bin/x", b"X", "f")]))],
                 layer_algo="sha512")
    store = open_store(str(tmp_path / "store"))
    r = TreeReader(store, convert.convert(str(src), store), Fetcher())
    assert r.read("/etc/os-release", 100, 0) == b"ID=ok\n" and r.read("/bin/x", 9, 0) == b"X"


def test_a_digest_that_is_a_path_never_reads_the_host_file(tmp_path):
    host_file = tmp_path / "secret.tar"   # a valid layer, outside the layout
    host_file.write_bytes(tar_layer([("secret", b"host data", "f")]))

    def aim_outside(manifest):
        manifest["layers"][0]["digest"] = "sha256:../../../secret.tar"
    refused(tmp_path, layout(tmp_path / "img", [LAYER], edit=aim_outside), "not a valid digest")


@pytest.mark.parametrize("bad", ["sha256:" + "A" * 64, "sha256:" + "a" * 63, "md5:" + "a" * 32,
                                 "sha256:" + "a" * 64 + "/x", "sha256" + "a" * 64, 7])
def test_malformed_digests_are_refused(tmp_path, bad):
    def forge(manifest):
        manifest["layers"][0]["digest"] = bad
    refused(tmp_path, layout(tmp_path / "img", [LAYER], edit=forge), "not a valid digest")


def _flip(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x20
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


def test_a_corrupt_layer_is_refused_and_nothing_is_published(tmp_path):
    src = layout(tmp_path / "img", [LAYER])
    _flip(src / "blobs/sha256" / hashlib.sha256(LAYER).hexdigest())
    refused(tmp_path, src, "corrupt")


def test_a_layer_with_bytes_after_the_tar_end_is_refused(tmp_path):
    """The tar reader stops at the end-of-archive marker: what follows is hashed too."""
    src = layout(tmp_path / "img", [LAYER])
    blob = src / "blobs/sha256" / hashlib.sha256(LAYER).hexdigest()
    blob.write_bytes(LAYER + b"trailing garbage")
    refused(tmp_path, src, "corrupt")


@pytest.mark.parametrize("which", ["manifest", "config"])
def test_a_corrupt_manifest_or_config_is_refused(tmp_path, which):
    src = layout(tmp_path / "img", [LAYER])
    index = json.loads((src / "index.json").read_text())
    mpath = src / "blobs/sha256" / index["manifests"][0]["digest"][7:]
    target = mpath if which == "manifest" else \
        src / "blobs/sha256" / json.loads(mpath.read_text())["config"]["digest"][7:]
    text = target.read_text()
    target.write_text(text.replace('"linux"', '"LINUX"') if which == "config"
                      else text.replace('"schemaVersion": 2', '"schemaVersion":  2'))
    refused(tmp_path, src, "corrupt")


def test_a_size_that_disagrees_is_refused(tmp_path):
    def lie(manifest):
        manifest["layers"][0]["size"] += 1
    refused(tmp_path, layout(tmp_path / "img", [LAYER], edit=lie), "descriptor says")


def test_a_fifo_blob_is_refused_without_blocking(tmp_path):
    src = layout(tmp_path / "img", [LAYER])
    blob = src / "blobs/sha256" / hashlib.sha256(LAYER).hexdigest()
    blob.unlink()
    os.mkfifo(blob)
    unblock = threading.Timer(20, lambda: os.open(blob, os.O_WRONLY | os.O_NONBLOCK))
    unblock.start()   # were the FIFO opened blocking, the test would fail, not hang
    try:
        refused(tmp_path, src, "not a regular file")
    finally:
        unblock.cancel()


def test_resolve_refuses_a_malformed_digest(tmp_path):
    with pytest.raises(InvalidDigest):
        convert.resolve("sha256:../../etc/passwd", open_store(str(tmp_path / "store")))


def test_members_under_an_image_symlink_land_where_it_points_inside_the_root(tmp_path):
    """``lib/x`` over ``lib -> usr/lib`` lands in ``/usr/lib`` (as a runtime applies the
    layer); a link aiming out of the root (``/../../outside``) stops at the root."""
    from tests.image.test_image import oci_layout
    l1 = tar_layer([("usr", None, "d"), ("usr/lib", None, "d"), ("lib", None, "l:usr/lib"),
                    ("evil", None, "l:/../../outside")])
    l2 = tar_layer([("lib/libx.so", b"X", "f"), ("evil/planted", b"P", "f")])
    store = open_store(str(tmp_path / "store"))
    r = TreeReader(store, convert.convert(str(oci_layout(tmp_path / "img", [l1, l2])), store),
                   Fetcher())   # a tree that passes the TOC check
    assert r.read("/usr/lib/libx.so", 9, 0) == b"X" and r.read("/outside/planted", 9, 0) == b"P"
    assert "/lib/libx.so" not in r.entries and r.entries["/lib"].type == "l"
