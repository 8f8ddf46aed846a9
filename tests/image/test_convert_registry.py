"""`image convert` speaks skopeo's and podman's registry conventions: --creds/--authfile
(never printed, never on skopeo's command line), --tls-verify, --platform from a
multi-platform index, --no-referrer, and the transports skopeo users type. Real
docker-registry (with htpasswd), real skopeo."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.image import referrer
from bootseer.store.backends.oci import OciBackend
from bootseer.errors import BlobNotFound
from tests.conftest import need, is_root
from tests.image.test_image import oci_layout, tar_layer

USER, PASSWORD = "alice", "s3cret-pw-7731"


def bootseer(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "bootseer", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=120)


def one_error_line(p: subprocess.CompletedProcess) -> str:
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert "Traceback" not in p.stderr, p.stderr
    assert lines and lines[0].startswith("bootseer: error: "), p.stderr
    return lines[0]


def put_blob(root: Path, data: bytes) -> dict:
    h = hashlib.sha256(data).hexdigest()
    (root / "blobs/sha256").mkdir(parents=True, exist_ok=True)
    (root / "blobs/sha256" / h).write_bytes(data)
    return {"digest": f"sha256:{h}", "size": len(data)}


def multi_platform_layout(root: Path) -> Path:
    """An OCI layout whose index holds a linux/amd64 and a linux/arm64 image, each with a
    file saying which it is (tag ``multi``)."""
    root.mkdir()
    entries = []
    for arch in ("amd64", "arm64"):
        layer = tar_layer([("etc", None, "d"), ("etc/arch", arch.encode(), "f")])
        config = put_blob(root, json.dumps({
            "architecture": arch, "os": "linux", "config": {},
            "rootfs": {"type": "layers",
                       "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]}}).encode())
        manifest = put_blob(root, json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        **put_blob(root, layer)}]}).encode())
        entries.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest,
                        "platform": {"architecture": arch, "os": "linux"}})
    index = put_blob(root, json.dumps({"schemaVersion": 2, "mediaType":
                                       "application/vnd.oci.image.index.v1+json",
                                       "manifests": entries}).encode())
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.index.v1+json", **index,
         "annotations": {"org.opencontainers.image.ref.name": "multi"}}]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def tree_file(store: Path, tree: str, path: str) -> bytes:
    from bootseer.store import open_store
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import TreeReader
    with Fetcher() as f:
        return TreeReader(open_store(str(store)), tree, f).read("/" + path, 1 << 20, 0)


def need_skopeo():
    need(shutil.which("skopeo") is not None, "skopeo is not installed")


@pytest.fixture
def auth_registry(registry_factory, tmp_path):
    need(shutil.which("htpasswd") is not None, "htpasswd missing (apt-get install apache2-utils)")
    need_skopeo()
    subprocess.run(["htpasswd", "-Bbc", str(tmp_path / "htpasswd"), USER, PASSWORD],
                   check=True, capture_output=True)
    return registry_factory(htpasswd=str(tmp_path / "htpasswd"))


def push(layout_ref: str, dest: str, *creds: str, all_platforms: bool = False) -> None:
    subprocess.run(["skopeo", "copy", "-q", *(["--all"] if all_platforms else []),
                    "--dest-tls-verify=false", *creds, layout_ref, f"docker://{dest}"],
                   check=True, capture_output=True, timeout=60)


@pytest.fixture
def skopeo_argv_log(tmp_path):
    """skopeo behind a wrapper that notes each command line it is given (what ``ps``
    would show every user of the node)."""
    real = shutil.which("skopeo")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "skopeo-argv.log"
    (bindir / "skopeo").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\nexec {real} "$@"\n')
    (bindir / "skopeo").chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}, log


def test_creds_pull_from_a_registry_that_needs_a_login(auth_registry, tmp_path,
                                                       skopeo_argv_log):
    env, argv_log = skopeo_argv_log
    layout = oci_layout(tmp_path / "layout", [tar_layer([("hello", b"hi\n", "f")])])
    ref = f"127.0.0.1:{auth_registry.port}/team/app:1"
    push(f"oci:{layout}", ref, f"--dest-creds={USER}:{PASSWORD}")
    store = tmp_path / "store"

    anon = bootseer("image", "convert", ref, "--store", store, env=env)
    assert anon.returncode == 1
    assert "cannot read image" in one_error_line(anon)

    ok = bootseer("image", "convert", ref, "--store", store, "--creds", f"{USER}:{PASSWORD}",
                  env=env)
    assert ok.returncode == 0, ok.stderr
    tree = ok.stdout.strip().splitlines()[-1]
    assert tree_file(store, tree, "hello") == b"hi\n"
    assert PASSWORD not in ok.stdout + ok.stderr + anon.stderr
    logged = argv_log.read_text()
    assert "--src-authfile=" in logged and PASSWORD not in logged
    # the referrer went in with the same login: found under the source with it
    repo = OciBackend(f"oci://127.0.0.1:{auth_registry.port}/team/app", username=USER,
                      password=PASSWORD)
    subject = repo.get_manifest("1")[2]
    index = json.loads(repo.get_manifest(referrer.tag_for(subject))[0])
    assert [m["artifactType"] for m in index["manifests"]] == [referrer.ARTIFACT_TYPE]
    # nothing left behind: the private auth file went with the convert's state
    assert not list(Path(os.environ.get("TMPDIR", "/var/tmp")).glob("bsconv-*/auth.json"))


def test_authfile_and_no_referrer(auth_registry, tmp_path):
    layout = oci_layout(tmp_path / "layout", [tar_layer([("hello", b"hi\n", "f")])])
    host = f"127.0.0.1:{auth_registry.port}"
    push(f"oci:{layout}", f"{host}/team/app:2", f"--dest-creds={USER}:{PASSWORD}")
    authfile = tmp_path / "auth.json"
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    authfile.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    p = bootseer("image", "convert", f"docker://{host}/team/app:2", "--store",
                 tmp_path / "store", "--authfile", authfile, "--no-referrer")
    assert p.returncode == 0, p.stderr
    repo = OciBackend(f"oci://{host}/team/app", username=USER, password=PASSWORD)
    subject = repo.get_manifest("2")[2]
    with pytest.raises(BlobNotFound):   # no referrer pushed into the source repository
        repo.get_manifest(referrer.tag_for(subject))
    missing = bootseer("image", "convert", f"{host}/team/app:2", "--authfile",
                       tmp_path / "nope.json", "--store", tmp_path / "store")
    assert missing.returncode == 2 and "--authfile" in one_error_line(missing)


def test_tls_verify_is_passed_to_skopeo(registry, tmp_path):
    """A loopback registry speaks plain http: skipped verification by default (as before);
    --tls-verify insists on https and so fails, in one line."""
    need_skopeo()
    layout = oci_layout(tmp_path / "layout", [tar_layer([("hello", b"hi\n", "f")])])
    ref = f"127.0.0.1:{registry.port}/team/tls:1"
    push(f"oci:{layout}", ref)
    strict = bootseer("image", "convert", ref, "--tls-verify", "--store", tmp_path / "s")
    assert strict.returncode == 1 and "cannot read image" in one_error_line(strict)
    relaxed = bootseer("image", "convert", ref, "--no-tls-verify", "--store", tmp_path / "s")
    assert relaxed.returncode == 0, relaxed.stderr


def test_platform_picks_the_manifest_of_an_index(registry, tmp_path):
    need_skopeo()
    layout = multi_platform_layout(tmp_path / "multi")
    store = tmp_path / "store"
    ref = f"127.0.0.1:{registry.port}/team/multi:1"
    push(f"oci:{layout}:multi", ref, all_platforms=True)
    for platform, want in ((None, b"amd64"), ("linux/arm64", b"arm64")):
        extra = ["--platform", platform] if platform else []
        for src in (ref, layout):   # through skopeo, and a layout read directly
            p = bootseer("image", "convert", src, "--store", store, *extra)
            assert p.returncode == 0, p.stderr
            assert tree_file(store, p.stdout.split()[-1], "etc/arch") == want
    none = bootseer("image", "convert", layout, "--platform", "linux/s390x", "--store", store)
    assert none.returncode == 1
    line = one_error_line(none)
    assert "no linux/s390x variant" in line and "linux/amd64, linux/arm64" in line
    bad = bootseer("image", "convert", layout, "--platform", "arm64", "--store", store)
    assert bad.returncode == 2 and "os/arch" in one_error_line(bad)


@pytest.mark.root
def test_transports_users_type(tmp_path):
    """``oci:DIR:TAG`` and ``containers-storage:`` go to skopeo as typed (here a private
    containers-storage, never the node's own)."""
    need_skopeo()
    need(is_root(), "containers-storage needs root")
    layout = multi_platform_layout(tmp_path / "multi")
    store = tmp_path / "store"
    p = bootseer("image", "convert", f"oci:{layout}:multi", "--platform", "linux/arm64",
                 "--store", store)
    assert p.returncode == 0, p.stderr
    assert tree_file(store, p.stdout.split()[-1], "etc/arch") == b"arm64"
    storage = tmp_path / "cs"
    cs = f"containers-storage:[vfs@{storage}/root+{storage}/run]localhost/bs-test:1"
    try:
        subprocess.run(["skopeo", "--override-arch", "amd64", "copy", "-q",
                        f"oci:{layout}:multi", cs], check=True, capture_output=True, timeout=60)
        p = bootseer("image", "convert", cs, "--store", store, "--creds", "x:y")
        assert p.returncode == 0, p.stderr
        assert tree_file(store, p.stdout.split()[-1], "etc/arch") == b"amd64"
    finally:
        subprocess.run(["umount", "-R", "-l", str(storage / "root")], capture_output=True)
        shutil.rmtree(storage, ignore_errors=True)


def test_creds_without_a_password_is_a_usage_error(tmp_path):
    p = bootseer("image", "convert", "127.0.0.1:1/a:1", "--creds", "alice", "--store",
                 tmp_path / "s")
    assert p.returncode == 2 and "USER:PASSWORD" in one_error_line(p)
