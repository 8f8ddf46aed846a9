"""Images end to end: convert (OCI layout with whiteouts, real registry via skopeo),
lazy mount, record -> profile -> prefetch, run in a container; faults."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from bootseer.errors import BlobNotFound
from bootseer.image import convert
from bootseer.store import open_store
from bootseer.tree import profile as prof
from tests.conftest import is_root, need

pytestmark = pytest.mark.timeout(240)


def tar_layer(members: list[tuple[str, bytes | None, str]]) -> bytes:
    """members: (name, data or None for dir, kind 'f'|'d'|'l:target'|'h:target')."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data, kind in members:
            ti = tarfile.TarInfo(name)
            if kind == "d":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            elif kind.startswith("l:"):
                ti.type, ti.linkname = tarfile.SYMTYPE, kind[2:]
            elif kind.startswith("h:"):
                ti.type, ti.linkname = tarfile.LNKTYPE, kind[2:]
            else:
                ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data) if kind == "f" else None)
    return buf.getvalue()


def oci_layout(root, layers: list[bytes], arch: str | None = None):
    """A single-image OCI layout of ``layers``; its config names ``arch`` (default: this
    node's, which a convert without --platform asks of a single image)."""
    from bootseer.image.registry import node_platform
    arch = arch or node_platform().split("/", 1)[1]
    blobs = root / "blobs/sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> dict:
        h = hashlib.sha256(data).hexdigest()
        (blobs / h).write_bytes(data)
        return {"digest": f"sha256:{h}", "size": len(data)}
    diff_ids = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]  # uncompressed
    config = put(json.dumps({"architecture": arch, "os": "linux",
                             "config": {"Env": ["PATH=/bin"]},
                             "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **put(layer)}
                           for layer in layers]}
    m = put(json.dumps(manifest).encode())
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", **m}]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def test_flatten_whiteouts_opaque_links(tmp_path):
    l1 = tar_layer([("etc", None, "d"), ("etc/a", b"A", "f"), ("etc/b", b"B", "f"),
                    ("opt", None, "d"), ("opt/old", b"O", "f"), ("bin", None, "d"),
                    ("bin/tool", b"T" * 3000, "f"), ("bin/hard", None, "h:bin/tool")])
    l2 = tar_layer([("etc/.wh.a", b"", "f"), ("opt/.wh..wh..opq", b"", "f"),
                    ("opt/new", b"N", "f"), ("etc/b", b"B2", "f"), ("bin/sh", None, "l:tool")])
    layout = oci_layout(tmp_path / "img", [l1, l2])
    store = open_store(str(tmp_path / "store"))
    digest = convert.convert(str(layout), store)
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import TreeReader
    r = TreeReader(store, digest, Fetcher())
    assert "/etc/a" not in r.entries and r.read("/etc/b", 10, 0) == b"B2"
    assert "/opt/old" not in r.entries and r.read("/opt/new", 10, 0) == b"N"
    assert r.entries["/bin/sh"].target == "tool" and r.entries["/bin/hard"].type == "h"
    assert r.toc.meta["env"] == ["PATH=/bin"]
    assert convert.resolve(str(layout), store) == digest


@pytest.mark.parametrize("kind", ["oci-archive", "docker-archive"])
def test_image_tars_of_either_kind_convert(tmp_path, kind):
    """``podman save`` writes docker-archive by default and oci-archive on request: a tar
    path is converted whichever it is (skopeo makes the tar from a layout here)."""
    layout = oci_layout(tmp_path / "img", [tar_layer([("etc", None, "d"),
                                                      ("etc/a", b"A" * 5000, "f")])])
    archive = tmp_path / "image.tar"
    subprocess.run(["skopeo", "copy", f"oci:{layout}", f"{kind}:{archive}"],
                   check=True, capture_output=True)
    assert convert._archive_kind(archive) == kind
    store = open_store(str(tmp_path / "store"))
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import TreeReader
    r = TreeReader(store, convert.convert(str(archive), store), Fetcher())
    assert r.read("/etc/a", 5000, 0) == b"A" * 5000
    # its metadata image made at convert time, named by the TOC: a start only fetches it
    from bootseer.tree import meta_image
    from bootseer.tree.blob import BlobLayout
    stored = store.read(r.toc.erofs["images"]["tree"])
    assert stored == meta_image.image_of(r.digest, r.toc, BlobLayout(r.toc))


def test_path_traversal_refused(tmp_path):
    layout = oci_layout(tmp_path / "img", [tar_layer([("../../etc/evil", b"x", "f")])])
    with pytest.raises(convert.ConvertError, match="escapes"):
        convert.convert(str(layout), open_store(str(tmp_path / "store")))


def test_malformed_layout_and_unknown_image(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/index.json").write_text("{not json")
    with pytest.raises(convert.ConvertError, match="not a readable OCI image layout"):
        convert.convert(str(tmp_path / "bad"), open_store(str(tmp_path / "s")))
    from bootseer.errors import BlobNotFound
    with pytest.raises(BlobNotFound, match="bootseer image convert"):
        convert.resolve("127.0.0.1:1/none:1", open_store(str(tmp_path / "s")))


def test_profiles_merge_and_refuse_other_trees():
    a = {"kind": "bootseer.profile", "tree": "t1", "runs": 1,
         "chunks": [["c1", 0.1, 1, "/a", 10], ["c2", 0.5, 1, "/b", 10]]}
    b = {"kind": "bootseer.profile", "tree": "t1", "runs": 1,
         "chunks": [["c2", 0.3, 2, "/b", 10], ["c3", 0.9, 1, "/c", 10]]}
    m = prof.merge([a, b], min_support=0.75)
    assert [r[0] for r in m["chunks"]] == ["c2"] and m["runs"] == 2
    m = prof.merge([a, b], byte_budget=20)
    assert [r[0] for r in m["chunks"]] == ["c1", "c2"]
    # a merged profile says how many of its runs read each chunk: merging it again counts
    # each run once (c1 was read by 1 of 2 runs, then by a third run: 2 of 3)
    ab = prof.merge([a, b])
    assert {r[0]: r[5] for r in ab["chunks"]} == {"c1": 1, "c2": 2, "c3": 1}
    c = {"kind": "bootseer.profile", "tree": "t1", "runs": 1, "chunks": [["c1", 0.2, 1, "/a", 10]]}
    abc = prof.merge([ab, c], min_support=0.6)
    assert abc["runs"] == 3 and [r[0] for r in abc["chunks"]] == ["c1", "c2"]
    with pytest.raises(prof.ProfileError, match="different trees"):
        prof.merge([a, {**b, "tree": "t2"}])
    with pytest.raises(prof.ProfileError, match="another image"):
        prof.check(a, "t2")


@pytest.fixture
def busybox_image(registry, busybox_rootfs, tmp_path):
    need(is_root(), "containers need root")
    from tests.run.test_baseline import push_busybox
    (busybox_rootfs / "data").mkdir(exist_ok=True)
    (busybox_rootfs / "data/payload.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    (busybox_rootfs / "data/cold.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    return push_busybox(registry, busybox_rootfs, tmp_path)


def bootseer(*args, env=None):
    return subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})


def test_record_then_prefetch_through_bootseer_run(need_fuse, busybox_image, tmp_path):
    store = str(tmp_path / "store")
    r = bootseer("image", "convert", busybox_image, "--to", store)
    assert r.returncode == 0, r.stderr
    tree = r.stdout.strip()
    assert convert.resolve(busybox_image, open_store(store)) == tree
    env1 = {"BOOTSEER_STORE_URL": store, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache1")}
    cmd = ["--", "sh", "-c", "cat /data/payload.bin > /dev/null; touch $BOOTSEER_READY_FILE; "
                             "sleep 0.3; exit 6"]
    r = bootseer("run", "--image", busybox_image, "--summary", str(tmp_path / "s1.json"), *cmd,
                 env=env1)
    assert r.returncode == 6, r.stderr
    p = prof.latest(open_store(store), tree)
    assert p is not None and sum(c[4] for c in p["chunks"]) >= 3 * 1024 * 1024
    assert not any(c[3] == "/data/cold.bin" for c in p["chunks"])
    # second start on a fresh node: prefetches the hot blocks
    env2 = {"BOOTSEER_STORE_URL": store, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache2")}
    r = bootseer("run", "--image", busybox_image, "--summary", str(tmp_path / "s2.json"), *cmd,
                 env=env2)
    assert r.returncode == 6, r.stderr
    s2 = json.loads((tmp_path / "s2.json").read_text())
    assert s2["phases"]["image.lazy"]["prefetch_chunks"] >= 3
    # `image run --prefetch` only prefetches (publishes nothing); `--record` only records
    published = open_store(store).get_ref(prof.ref_for(tree))
    runs = prof.latest(open_store(store), tree)["runs"]
    env3 = {"BOOTSEER_STORE_URL": store, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache3")}
    r = bootseer("image", "run", busybox_image, "--prefetch", *cmd, env=env3)
    assert r.returncode == 6, r.stderr
    assert open_store(store).get_ref(prof.ref_for(tree)) == published
    env4 = {"BOOTSEER_STORE_URL": store, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache4")}
    # ... and its window closes at a log line (--ready-regex) as at the ready file
    r = bootseer("image", "run", busybox_image, "--record", "--ready-regex", "^READY$", "--",
                 "sh", "-c", "cat /data/payload.bin > /dev/null; echo READY; sleep 0.3; exit 6",
                 env=env4)
    assert r.returncode == 6 and "READY" in r.stdout, r.stderr
    assert prof.latest(open_store(store), tree)["runs"] == runs + 1
    assert bootseer("image", "run", busybox_image, "--record", "--prefetch", *cmd,
                    env=env4).returncode == 2   # one or the other (default: both)
    # missing command: 127 with a clear message; nothing left mounted
    r = bootseer("run", "--image", busybox_image, "--", "python3", "-c", "1", env=env2)
    assert r.returncode == 127 and "not found in image" in r.stderr
    assert not [line for line in open("/proc/mounts") if "bootseer-image" in line]


def test_image_env_and_workdir_apply_to_the_command(need_fuse, registry, busybox_rootfs,
                                                   tmp_path):
    """The image's Env (PATH included: a tool only on the image's PATH is found) and
    WorkingDir apply as under a container engine, lazily mounted or pulled; bootseer's own
    variables still win."""
    from tests.run.test_baseline import push_busybox
    tools = busybox_rootfs / "opt/tools"
    tools.mkdir(parents=True, exist_ok=True)
    (tools / "hello").write_text("#!/bin/sh\necho hello from $GREETING in $(pwd)\n")
    (tools / "hello").chmod(0o755)
    (busybox_rootfs / "srv").mkdir(exist_ok=True)
    ref = push_busybox(registry, busybox_rootfs, tmp_path, tag="cfg", config=(
        "--env", "PATH=/opt/tools:/bin", "--env", "GREETING=the-image",
        "--env", "BOOTSEER_READY_FILE=/nowhere", "--workingdir", "/srv"))
    store = str(tmp_path / "store")
    assert bootseer("image", "convert", ref, "--to", store).returncode == 0
    env = {"BOOTSEER_STORE_URL": store, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache")}
    r = bootseer("image", "run", ref, "--", "sh", "-c",
                 "hello; touch $BOOTSEER_READY_FILE; test -e /run/bootseer/ready", env=env)
    assert r.returncode == 0, r.stderr
    assert "hello from the-image in /srv" in r.stdout
    r = bootseer("image", "run", ref, "--", "hello", env=env)   # CMD itself on that PATH
    assert r.returncode == 0 and "hello from the-image" in r.stdout, r.stderr
    r = bootseer("run", "--pull", "--image", ref, "--", "hello", env=env)   # the baseline too
    assert r.returncode == 0 and "hello from the-image in /srv" in r.stdout, r.stderr


def test_corrupt_chunk_is_eio_in_the_container(need_fuse, busybox_image, tmp_path):
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    tree = convert.convert(busybox_image, store)
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import TreeReader
    r = TreeReader(store, tree, Fetcher())
    ref = r.entries["/data/payload.bin"].chunks[0]
    pack = store.path(r.packs[ref.pack])
    os.chmod(pack, 0o644)
    with open(pack, "r+b") as f:
        f.seek(ref.offset + 5)
        b = f.read(1)
        f.seek(ref.offset + 5)
        f.write(bytes([b[0] ^ 0xFF]))
    res = bootseer("run", "--image", tree, "--", "sh", "-c",
                   "cat /data/payload.bin > /dev/null && exit 0 || exit 5",
                   env={"BOOTSEER_STORE_URL": str(store_dir),
                        "BOOTSEER_CACHE_DIR": str(tmp_path / "c")})
    assert res.returncode == 5, res.stderr


def test_unknown_image_is_refused_before_mounting(need_fuse, tmp_path):
    r = bootseer("image", "mount", "sha256:" + "4" * 64, str(tmp_path),
                 env={"BOOTSEER_STORE_URL": str(tmp_path / "s")})
    assert r.returncode == 1 and "not found" in r.stderr
    assert not os.path.ismount(tmp_path)


def test_convert_announces_the_tree_next_to_its_source(busybox_image, registry, tmp_path):
    """Converting a registry image pushes an artifact manifest whose subject is the source
    manifest, listed under the OCI 1.1 tag-schema fallback (the Debian registry has no
    referrers API); a second conversion refreshes it instead of duplicating it."""
    from bootseer.image import referrer
    from bootseer.store.backends.oci import OciBackend
    store = str(tmp_path / "store")
    for _ in range(2):
        r = bootseer("image", "convert", busybox_image, "--to", store)
        assert r.returncode == 0, r.stderr
    tree = r.stdout.strip().splitlines()[-1]
    found = referrer.find(busybox_image)
    assert [(f["tree"], f["store"]) for f in found] == [(tree, store)]
    url, tag = referrer.registry_ref(busybox_image)
    repo = OciBackend(url)
    _, _, subject = repo.get_manifest(tag)
    artifact = json.loads(repo.get_manifest(found[0]["artifact"])[0])
    assert artifact["subject"]["digest"] == subject
    assert artifact["artifactType"] == referrer.ARTIFACT_TYPE
    # the same manifest under a new tag: found through the referrer, not a store ref
    from bootseer.image.convert import resolve
    from bootseer.store import open_store
    retagged = busybox_image.rsplit(":", 1)[0] + ":retagged"
    subprocess.run(["skopeo", "copy", "--src-tls-verify=false", "--dest-tls-verify=false",
                    f"docker://{busybox_image}", f"docker://{retagged}"], check=True,
                   capture_output=True)
    assert resolve(retagged, open_store(store)) == tree
    with pytest.raises(BlobNotFound, match="announced in another store"):
        resolve(retagged, open_store(str(tmp_path / "other-store")))
    assert referrer.registry_ref("docker-archive:/x.tar") is None
    assert referrer.registry_ref("127.0.0.1:5000/a/b@sha256:ab") == ("oci://127.0.0.1:5000/a/b",
                                                                    "sha256:ab")


def test_image_mount_cli_records_traces_and_unmounts_on_sigterm(need_fuse, tmp_path):
    """`bootseer image mount --record` in the foreground: files read through it, SIGTERM
    unmounts, the start's figures land in the trace (image.window) and the recorded
    profile is pushed to the store for the next mount's prefetch."""
    import signal
    import time
    layout = tmp_path / "layout"
    layout.mkdir()
    oci_layout(layout, [tar_layer([("app", None, "d"), ("app/a.py", b"A = 1\n" * 100, "f"),
                                   ("app/b.bin", os.urandom(300_000), "f")])])
    store = str(tmp_path / "store")
    tree = bootseer("image", "convert", str(layout), "--to", store).stdout.strip().splitlines()[-1]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache/blobs"),
           "BOOTSEER_TRACE_LOCATION": str(tmp_path / "trace"), "BOOTSEER_TRACE_JOB_ID": "j",
           "BOOTSEER_TRACE_NODE": "n0"}
    p = subprocess.Popen([sys.executable, "-m", "bootseer", "image", "mount", tree, str(mnt),
                          "--record", "--window", "3", "--store", store], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not os.path.ismount(mnt):
        assert p.poll() is None and time.time() < deadline, p.stderr.read()
        time.sleep(0.05)
    assert (mnt / "app/a.py").read_bytes() == b"A = 1\n" * 100
    time.sleep(3.5)   # past --window 3 with no read after it: the window closed by timeout
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert not os.path.ismount(mnt)
    from bootseer.report import load as trace_load
    marks = [e for e in trace_load.load(tmp_path / "trace").events
             if e.get("phase") == "image.window"]
    assert marks and marks[0]["attrs"]["tree"] == tree and marks[0]["attrs"]["read_chunks"] >= 1
    assert marks[0]["attrs"]["closed_by"] == "timeout"
    assert prof.latest(open_store(store), tree) is not None
    trigger = out.split("`touch ")[1].split("`")[0]          # told how to close the window,
    assert trigger.endswith("close-window") and not os.path.exists(os.path.dirname(trigger))
    #                                                          and its state dir is removed


def test_profile_push_refuses_what_is_not_a_profile_of_a_stored_tree(tmp_path):
    store = str(tmp_path / "store")
    os.makedirs(store)
    cases = {"garbage.json": "{not json", "other.json": json.dumps({"v": 1}),
             "notree.json": json.dumps({"kind": "bootseer.profile", "chunks": []}),
             "missing.json": json.dumps({"kind": "bootseer.profile", "tree": "sha256:" + "a" * 64,
                                         "runs": 1, "chunks": []})}
    says = {"garbage.json": "cannot read the profile", "other.json": "not a bootseer hot-block",
            "notree.json": "names no tree", "missing.json": "is not in"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        r = bootseer("image", "profile", "push", str(tmp_path / name), "--store", store)
        assert r.returncode == 2 and says[name] in r.stderr, (name, r.stderr)   # bad input
        assert "Traceback" not in r.stderr
