"""Restores as kernel mounts: EROFS on the snapshot's blob in the node cache, an overlay on
top, at the prefix; and their faults: a tampered blob or metadata image, an unmount while a
process holds a file open, a kernel without file-backed EROFS, a user's directory at the
prefix, a fetch killed halfway. Real index (nginx), real uv, real kernel mounts."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer.deps import ensure as E
from bootseer.deps.mounts import unmount
from bootseer.deps.prefix import mounted_info, rmtree, sidecar, state_dir
from bootseer.deps.resolve import DepsError
from bootseer.node import mounts as points
from tests.deps.test_deps import cfg, serve_index

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("need_root")]
PY = sys.executable
MODULE = "lib/python3.11/site-packages/bskern_one/__init__.py"
# imports both test packages; prints 3
BOTH = "import bskern_one, bskern_two; print(bskern_one.X + bskern_two.Y)"


@pytest.fixture
def index(nginx_factory, tmp_path):
    urls, spec = serve_index(nginx_factory, tmp_path,
                             [("bskern_one", "1.0", "X = 1\n"), ("bskern_two", "1.0", "Y = 2\n")],
                             "bskern-one==1.0\nbskern-two==1.0\n")
    return urls, str(spec)


@pytest.fixture
def published(index, tmp_path):
    """A snapshot built and published at ``<tmp>/env`` by node n0; the prefix is then
    empty, as on a fresh node: (urls, spec, prefix, key)."""
    urls, spec = index
    prefix = str(tmp_path / "env")
    built = E.ensure(spec, prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n0"))
    assert built.how == "built"
    rmtree(prefix)
    yield urls, spec, prefix, built.key
    if os.path.exists(sidecar(prefix)):
        unmount(prefix)


def restore(published, tmp_path, node: str, **kw) -> E.Result:
    urls, spec, prefix, key = published
    return E.ensure(spec, prefix, python=PY, index_urls=urls, key=key,
                    config=kw.pop("config", None) or cfg(tmp_path, node), **kw)


def run_py(prefix, code: str) -> str:
    p = subprocess.run([f"{prefix}/bin/python", "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "bootseer", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def blob_of(tmp_path, node: str) -> Path:
    blobs = list((tmp_path / node / "cache" / "erofs").glob("*.blob"))
    assert len(blobs) == 1, blobs
    return blobs[0]


def test_restore_mounts_the_blob_writable_warm_and_unmounts_clean(published, tmp_path):
    urls, spec, prefix, key = published
    seen = []
    r = restore(published, tmp_path, "n1", progress=lambda n, total: seen.append((n, total)))
    assert (r.how, r.form) == ("restored", "mount")
    assert sum(n for n, _ in seen) == seen[-1][1] > 0          # the progress bar's feed
    state = state_dir(prefix)
    assert points.find(prefix).fstype == "overlay"
    assert points.find(f"{state}/lower").fstype == "erofs"
    assert run_py(prefix, BOTH) == "3"
    assert not os.listdir(f"{state}/upper")                  # nothing was extracted
    # a job may write into its environment: into the overlay, never the blob
    blob = blob_of(tmp_path, "n1")
    blob_bytes = blob.read_bytes()
    site = f"{prefix}/lib/python3.11/site-packages"
    Path(f"{site}/bskern_extra.py").write_text("Z = 7\n")
    assert run_py(prefix, "import bskern_extra; print(bskern_extra.Z)") == "7"
    assert os.path.exists(f"{state}/upper/lib/python3.11/site-packages/bskern_extra.py")
    assert blob.read_bytes() == blob_bytes
    # warm: the live mount answers at once
    t = time.perf_counter()
    assert restore(published, tmp_path, "n1").how == "warm"
    assert time.perf_counter() - t < 0.1
    # verify re-hashes through the mount and sees a changed file
    store = str(tmp_path / "store")
    v = cli("deps", "verify", prefix, "--store", store)
    assert v.returncode == 0 and "OK" in v.stdout, v.stdout + v.stderr
    os.chmod(f"{prefix}/{MODULE}", 0o644)
    Path(f"{prefix}/{MODULE}").write_text("X = 99\n")
    v = cli("deps", "verify", prefix, "--store", store)
    assert v.returncode == 1 and f"modified /{MODULE}" in v.stdout, v.stdout + v.stderr
    # umount: nothing left beside the prefix but the (empty) directory; the blob stays
    u = cli("deps", "umount", prefix)
    assert u.returncode == 0, u.stderr
    assert not os.path.ismount(prefix) and os.listdir(prefix) == []
    assert not os.path.exists(sidecar(prefix)) and not os.path.exists(state)
    assert blob.exists()
    # the blob in the node cache: mounted again without the store (a dead one here), the
    # overlay's writes gone
    dead = cfg(tmp_path, "n1").replace(store={"url": "http://127.0.0.1:9/gone"})
    r = restore(published, tmp_path, "n1", config=dead)
    assert (r.how, r.form) == ("restored", "mount")
    assert run_py(prefix, "import bskern_one; print(bskern_one.X)") == "1"
    assert not os.path.exists(f"{site}/bskern_extra.py")
    assert cli("deps", "umount", prefix).returncode == 0
    assert cli("deps", "umount", prefix).returncode == 1        # nothing mounted now


def test_a_tampered_blob_or_metadata_image_is_never_mounted(published, tmp_path, caplog):
    urls, spec, prefix, key = published
    restore(published, tmp_path, "n1")
    unmount(prefix)
    blob = blob_of(tmp_path, "n1")
    at = blob.read_bytes().index(b"X = 1\n")
    # one byte of a module's data flipped, then one of the zeros padding its 4 KiB slot
    for offset, byte in ((at + 4, b"7"), (at + 100, b"\1")):
        blob = blob_of(tmp_path, "n1")
        with open(blob, "r+b") as f:
            f.seek(offset)
            f.write(byte)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            r = restore(published, tmp_path, "n1")
        assert (r.how, r.form) == ("restored", "mount")
        assert "fails verification, removed and fetched again" in caplog.text
        v = cli("deps", "verify", prefix, "--store", str(tmp_path / "store"))
        assert v.returncode == 0 and "OK" in v.stdout, v.stdout + v.stderr
        assert blob_of(tmp_path, "n1").read_bytes()[offset] == 0 if byte == b"\1" else True
        unmount(prefix)
    # a blob verified before this boot (a crash may have lost data it was written with) is
    # verified again before it is mounted
    stamp_file = Path(f"{blob_of(tmp_path, 'n1')}.verified")
    stamp_file.write_text(json.dumps({**json.loads(stamp_file.read_text()), "boot": "earlier"}))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert restore(published, tmp_path, "n1").form == "mount"
    assert "verifying the node's blob" in caplog.text and "fails" not in caplog.text
    unmount(prefix)
    caplog.clear()
    meta = next((tmp_path / "n1" / "cache" / "erofs").glob("*.meta"))
    data = bytearray(meta.read_bytes())
    data[1024] ^= 0xFF                 # the superblock's magic: never mountable as it is
    meta.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO):
        r = restore(published, tmp_path, "n1")
    assert (r.how, r.form) == ("restored", "mount")
    assert "does not match its sum: written anew" in caplog.text
    assert run_py(prefix, BOTH) == "3"


def test_a_restore_mounts_the_snapshots_stored_metadata_image(published, tmp_path, caplog,
                                                               monkeypatch):
    """The snapshot's metadata image is made when it is published and named in its TOC: a
    fresh node mounts that one and writes none; a copy in the store failing its digest is
    never mounted (the node writes its own)."""
    from bootseer.deps.snapshot import env_ref, load_manifest
    from bootseer.store import open_store
    from bootseer.tree import format as fmt
    from bootseer.tree import meta_image
    urls, spec, prefix, key = published
    store = open_store(str(tmp_path / "store"))
    tree = load_manifest(store, store.get_ref(env_ref(key)), key)["tree"]
    image = fmt.decode(store.read(tree), tree).erofs["images"]["env"]
    written = meta_image.write_image

    def refuse(*a, **kw):
        raise AssertionError("a metadata image was written at the restore")
    monkeypatch.setattr(meta_image, "write_image", refuse)
    with caplog.at_level(logging.INFO, logger="bootseer"):
        assert restore(published, tmp_path, "n1").form == "mount"
    assert run_py(prefix, BOTH) == "3"
    assert "its stored metadata image" in caplog.text and "writing it here" not in caplog.text
    metas = list((tmp_path / "n1" / "cache" / "erofs").glob("*.meta"))
    assert [m.read_bytes() for m in metas] == [store.read(image)]
    unmount(prefix)
    monkeypatch.setattr(meta_image, "write_image", written)
    path = store.path(image)
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[1024] ^= 0xFF
    path.write_bytes(bytes(data))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bootseer"):
        assert restore(published, tmp_path, "n2").form == "mount"
    assert caplog.text.count("stored metadata image cannot be used") == 1
    assert run_py(prefix, BOTH) == "3"
    metas = list((tmp_path / "n2" / "cache" / "erofs").glob("*.meta"))
    assert len(metas) == 1 and metas[0].read_bytes() != bytes(data)


def test_umount_while_a_process_holds_a_file_open_is_lazy_and_leaves_nothing(published, tmp_path):
    urls, spec, prefix, key = published
    restore(published, tmp_path, "n1")
    holder = subprocess.Popen(
        [f"{prefix}/bin/python", "-c", "import sys; f = open(sys.argv[1]); print('open', "
         "flush=True); sys.stdin.readline(); print(f.read().strip(), flush=True)",
         f"{prefix}/{MODULE}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=tmp_path)
    try:
        assert holder.stdout.readline().strip() == "open"
        u = cli("deps", "umount", prefix)
        assert u.returncode == 0, u.stderr
        assert not os.path.ismount(prefix) and not os.path.ismount(f"{state_dir(prefix)}/lower")
        assert not os.path.exists(sidecar(prefix))
        assert not os.path.exists(state_dir(prefix))
        out, _ = holder.communicate("\n", timeout=30)   # its open file still reads
        assert out.strip() == "X = 1"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    roots = [e for e in points.table() if e.mountpoint.startswith(str(tmp_path))]
    assert roots == []
    r = restore(published, tmp_path, "n1")           # and the prefix mounts again
    assert (r.how, r.form) == ("restored", "mount")


def test_a_kernel_without_file_backed_erofs_extracts_and_says_so_once(published, tmp_path,
                                                                      monkeypatch, caplog):
    urls, spec, prefix, key = published
    from bootseer.mount import choose
    from bootseer.mount.erofs import kernel
    monkeypatch.setattr(kernel, "availability", lambda: "the kernel has no EROFS (test)")
    monkeypatch.setattr(choose, "_said", set())
    with caplog.at_level(logging.WARNING):
        r1 = restore(published, tmp_path, "n1")
        rmtree(prefix)
        r2 = restore(published, tmp_path, "n2")
    assert (r1.how, r1.form) == (r2.how, r2.form) == ("restored", "directory")
    assert not os.path.ismount(prefix)
    assert run_py(prefix, "import bskern_one; print(bskern_one.X)") == "1"
    said = [r for r in caplog.records if "restored by extraction" in r.getMessage()]
    assert len(said) == 1 and "the kernel has no EROFS (test)" in said[0].getMessage()
    # the configuration's seam: the kernel path off, from the command line, one line
    rmtree(prefix)
    env = {**os.environ, "BOOTSEER_MOUNT_BACKEND": "fuse", "BOOTSEER_STORE_URL":
           str(tmp_path / "store"), "BOOTSEER_CACHE_DIR": str(tmp_path / "n3" / "cache")}
    out = cli("deps", "ensure", spec, "--prefix", prefix, "--key", key, "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["form"] == "directory"
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "restored by extraction" in lines[0], out.stderr


def test_a_users_directory_at_the_prefix_is_never_mounted_over(published, tmp_path):
    urls, spec, prefix, key = published
    os.makedirs(prefix, exist_ok=True)
    Path(prefix, "notes.txt").write_text("mine")
    with pytest.raises(DepsError, match="not made by bootseer"):
        restore(published, tmp_path, "n1")
    env = {**os.environ, "BOOTSEER_STORE_URL": str(tmp_path / "store"),
           "BOOTSEER_CACHE_DIR": str(tmp_path / "n1" / "cache")}
    out = cli("deps", "ensure", spec, "--prefix", prefix, "--key", key, env=env)
    assert out.returncode != 0 and out.stderr.startswith("bootseer: error: ") and \
        "not made by bootseer" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not os.path.ismount(prefix) and os.listdir(prefix) == ["notes.txt"]
    assert Path(prefix, "notes.txt").read_text() == "mine"
    assert not os.path.exists(sidecar(prefix)) and not os.path.exists(state_dir(prefix))


def test_copy_and_read_only(published, tmp_path):
    urls, spec, prefix, key = published
    r = restore(published, tmp_path, "n1", writable=False)
    assert r.form == "mount" and points.find(prefix).fstype == "erofs"
    with pytest.raises(OSError, match="Read-only file system"):
        open(f"{prefix}/pyvenv.cfg", "a")
    # --copy wants a plain directory: the mount (same key) is replaced by one
    out = cli("deps", "ensure", spec, "--prefix", prefix, "--key", key, "--copy", "--json",
              env={**os.environ, "BOOTSEER_STORE_URL": str(tmp_path / "store"),
                   "BOOTSEER_CACHE_DIR": str(tmp_path / "n1" / "cache")})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["form"] == "directory" and not os.path.ismount(prefix)
    assert not os.path.exists(sidecar(prefix)) and not os.path.exists(state_dir(prefix))
    assert run_py(prefix, "import bskern_one; print(bskern_one.X)") == "1"
    bad = cli("deps", "ensure", spec, "--prefix", prefix, "--mount", "--copy")
    assert bad.returncode == 2 and bad.stderr.startswith("bootseer: error: ")
    assert "--mount" in bad.stderr


def test_gc_unmounts_an_unused_mounted_environment_and_drops_its_blob(published, tmp_path):
    from bootseer.deps.gc import environments, gc
    urls, spec, prefix, key = published
    restore(published, tmp_path, "n1")
    config = cfg(tmp_path, "n1")
    blob = blob_of(tmp_path, "n1")
    [env] = [e for e in environments(config) if e.prefix == prefix]
    assert env.kernel and env.bytes == blob.stat().st_size
    holder = subprocess.Popen([f"{prefix}/bin/python", "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        [(_, action)] = [(e, a) for e, a in gc(config, 0) if e.prefix == prefix]
        assert action.startswith("in use") and os.path.ismount(prefix)
    finally:
        holder.kill()
        holder.wait()
    [(_, action)] = [(e, a) for e, a in gc(config, 0) if e.prefix == prefix]
    assert action == "removed"
    assert not os.path.ismount(prefix) and not blob.exists()
    assert not os.path.exists(sidecar(prefix)) and mounted_info(prefix) is None
    # unmounted, its blob is still the environment's disk on this node: gc drops it too
    restore(published, tmp_path, "n1")
    unmount(prefix)
    [env] = [e for e in environments(config) if e.prefix == prefix]
    assert not env.mounted and env.bytes == blob_of(tmp_path, "n1").stat().st_size
    [(_, action)] = [(e, a) for e, a in gc(config, 0) if e.prefix == prefix]
    assert action == "removed" and not list(blob.parent.glob("*.blob"))
    assert [e for e in environments(config) if e.prefix == prefix] == []


def test_a_fetch_killed_halfway_leaves_no_mount_and_its_part_is_swept(published, tmp_path,
                                                                      nginx_factory):
    urls, spec, prefix, key = published
    slow = nginx_factory(tmp_path / "store", limit_rate="1k")   # a store that crawls
    erofs = tmp_path / "n1" / "cache" / "erofs"
    env = {**os.environ, "BOOTSEER_STORE_URL": slow.url,
           "BOOTSEER_CACHE_DIR": str(tmp_path / "n1" / "cache")}
    p = subprocess.Popen([PY, "-m", "bootseer", "deps", "ensure", spec, "--prefix", prefix,
                          "--key", key], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not (erofs.exists() and [n for n in os.listdir(erofs) if ".part-" in n]):
        assert p.poll() is None and time.time() < deadline, p.stderr.read()
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not os.path.ismount(prefix) and not os.listdir(prefix) if os.path.exists(prefix) \
        else True
    assert mounted_info(prefix) is None
    r = restore(published, tmp_path, "n1")
    assert (r.how, r.form) == ("restored", "mount")
    assert [n for n in os.listdir(erofs) if ".part-" in n] == []
    assert run_py(prefix, "import bskern_one; print(bskern_one.X)") == "1"


def _killed_part_writer(dest: Path) -> None:
    """What a fetch of ``dest`` killed midway and never retried leaves: its part."""
    code = ("import os, sys, time\nfrom bootseer.node.partfile import PartFile\n"
            "part = PartFile(sys.argv[1])\nos.write(part.fd, b'x' * 65536)\n"
            "print('writing', flush=True)\ntime.sleep(600)\n")
    p = subprocess.Popen([PY, "-c", code, str(dest)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "writing\n"
    p.send_signal(signal.SIGKILL)
    p.wait()


def test_the_next_fetch_removes_every_dead_writers_part(published, tmp_path):
    """A part is removed by the next fetch on the node whichever blob it was for: the
    part of an environment never fetched again stayed for ever."""
    _, _, prefix, _ = published
    restore(published, tmp_path, "n1")
    unmount(prefix)
    erofs = tmp_path / "n1" / "cache" / "erofs"
    blob_of(tmp_path, "n1").unlink()   # fetched again; its metadata image is still good
    _killed_part_writer(erofs / f"{'f' * 64}.blob")
    assert [n for n in os.listdir(erofs) if ".part-" in n]
    r = restore(published, tmp_path, "n1")
    assert (r.how, r.form) == ("restored", "mount")
    assert [n for n in os.listdir(erofs) if ".part-" in n] == []


@pytest.mark.parametrize("flag", [None, "-q", "--no-progress"])
def test_the_blob_fetch_shows_a_bar_on_a_terminal_only(published, tmp_path, flag):
    from types import SimpleNamespace

    from tests.cli.test_progress import on_a_terminal
    urls, spec, prefix, key = published
    env = {**os.environ, "BOOTSEER_STORE_URL": str(tmp_path / "store"),
           "BOOTSEER_CACHE_DIR": str(tmp_path / "n1" / "cache")}
    argv = ["deps", "ensure", spec, "--prefix", prefix, "--key", key]
    rc, out, shown = on_a_terminal(SimpleNamespace(root=tmp_path, env=env),
                                   *([flag] if flag else []), *argv)
    assert rc == 0 and out.startswith("restored"), shown
    assert mounted_info(prefix)["backend"] == "erofs"
    if flag is None:
        assert "restore" in shown and "100%" in shown, shown
    else:
        assert "%" not in shown, shown


def test_a_mounted_environment_has_no_set_id_bits_or_privileged_xattrs(tmp_path):
    """As an extraction restores it: a snapshot's set-id bits and xattrs outside ``user.``
    never reach the mount (which is nosuid besides)."""
    from bootseer.deps.snapshot import publish
    from bootseer.store import open_store
    src = tmp_path / "built"
    (src / "bin").mkdir(parents=True)
    tool = src / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    os.chmod(tool, 0o4755)
    os.setxattr(tool, "trusted.bootseer-test", b"1")
    os.setxattr(tool, "user.bootseer-test", b"2")
    os.mkfifo(src / "bin" / "pipe")
    prefix, key = str(tmp_path / "env"), "sha256:" + "5" * 64
    publish(open_store(str(tmp_path / "store")), prefix, key, root=str(src))
    r = E.ensure("unused.txt", prefix, key=key, config=cfg(tmp_path, "n1"))
    try:
        assert r.form == "mount"
        st = os.stat(f"{prefix}/bin/tool")
        assert st.st_mode & 0o7777 == 0o755
        assert os.listxattr(f"{prefix}/bin/tool") == ["user.bootseer-test"]
        assert os.getxattr(f"{prefix}/bin/tool", "user.bootseer-test") == b"2"
        assert sorted(os.listdir(f"{prefix}/bin")) == ["tool"]     # no fifo, no device
    finally:
        unmount(prefix)


def test_a_node_cache_on_tmpfs_mounts_with_the_image_beside_the_prefix(published, tmp_path):
    """The kernel mounts no metadata image from tmpfs: it is written in the prefix's state
    directory then, and removed with the mount."""
    urls, spec, prefix, key = published
    cache = tmp_path / "tmpfs-cache"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(cache)], check=True)
    try:
        config = cfg(tmp_path, "n1").replace(cache={"dir": str(cache)})
        r = restore(published, tmp_path, "n1", config=config)
        assert (r.how, r.form) == ("restored", "mount")
        assert list(Path(state_dir(prefix)).glob("*.meta"))
        assert run_py(prefix, "import bskern_one; print(bskern_one.X)") == "1"
        assert cli("deps", "umount", prefix).returncode == 0
        assert not os.path.exists(state_dir(prefix))
        r = restore(published, tmp_path, "n1", config=config)     # from the node's blob
        assert (r.how, r.form) == ("restored", "mount")
        unmount(prefix)
    finally:
        subprocess.run(["umount", str(cache)], check=True)


def test_another_key_replaces_an_unused_mount_never_one_in_use(published, tmp_path):
    urls, spec, prefix, key = published
    other = tmp_path / "other.txt"
    other.write_text("bskern-one==1.0\n")
    b = E.ensure(str(other), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n0"))
    assert b.how == "built"
    rmtree(prefix)
    restore(published, tmp_path, "n1")
    Path(f"{prefix}/job-note.txt").write_text("mine")      # in the overlay of key A
    holder = subprocess.Popen([f"{prefix}/bin/python", "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        with pytest.raises(DepsError, match="in use by pid"):
            E.ensure(str(other), prefix, python=PY, index_urls=urls, key=b.key,
                     config=cfg(tmp_path, "n1"))
        assert mounted_info(prefix)["key"] == key
        assert Path(f"{prefix}/job-note.txt").read_text() == "mine"
    finally:
        holder.kill()
        holder.wait()
    r = E.ensure(str(other), prefix, python=PY, index_urls=urls, key=b.key,
                 config=cfg(tmp_path, "n1"))
    assert (r.how, r.form) == ("restored", "mount") and mounted_info(prefix)["key"] == b.key
    assert not os.path.exists(f"{prefix}/job-note.txt")    # A's overlay went with A
    assert run_py(prefix, "import bskern_one; print(bskern_one.X)") == "1"
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([f"{prefix}/bin/python", "-c", "import bskern_two"], check=True,
                       capture_output=True)


def test_a_mount_whose_command_died_before_completing_its_sidecar_is_replaced(published,
                                                                              tmp_path):
    """Killed between mount(2) and writing the mount's id: the next ensure recognises the
    mount as ours (sidecar, EROFS/overlay), unmounts it and mounts again, never on top."""
    urls, spec, prefix, key = published
    restore(published, tmp_path, "n1")
    info = json.loads(Path(sidecar(prefix)).read_text())
    Path(sidecar(prefix)).write_text(json.dumps({**info, "mount_id": None}))
    assert mounted_info(prefix) is None                      # not a complete mount
    r = restore(published, tmp_path, "n1")
    assert (r.how, r.form) == ("restored", "mount")
    real = os.path.realpath(prefix)
    assert [e.fstype for e in points.table() if e.mountpoint == real] == ["overlay"]
    assert run_py(prefix, "import bskern_one; print(bskern_one.X)") == "1"
    # killed between EROFS and the overlay: the lower layer is mounted, PREFIX is not
    subprocess.run(["umount", prefix], check=True)
    r = restore(published, tmp_path, "n1")
    assert (r.how, r.form) == ("restored", "mount")
    lower = os.path.realpath(f"{state_dir(prefix)}/lower")
    assert [e.fstype for e in points.table() if e.mountpoint == lower] == ["erofs"]
    assert [e.fstype for e in points.table() if e.mountpoint == real] == ["overlay"]


def test_a_lazy_image_making_room_for_its_blob_never_removes_an_environment_blob(published,
                                                                                 tmp_path):
    """Lazy images and restored environments keep EROFS blobs in the same node cache; an
    image making room for its blob (at most half the cache budget for its blobs) removes
    only the image path's own blobs: the node still remounts the environment without the
    store."""
    from bootseer.store import open_store
    from bootseer.store.cache import NodeCache
    from bootseer.store.fetch import Fetcher
    from bootseer.tree import format as fmt
    from bootseer.tree.blob import BlobLayout
    from bootseer.tree.build import TreeBuilder, add_directory
    from bootseer.tree.reader import TreeReader
    from bootseer.tree.session import mount_tree
    urls, spec, prefix, key = published
    restore(published, tmp_path, "n1")
    unmount(prefix)
    env_blob = blob_of(tmp_path, "n1")
    src = tmp_path / "image-src"
    src.mkdir()
    (src / "weights.bin").write_bytes(os.urandom(3 << 20))
    store = open_store(str(tmp_path / "image-store"))
    b = TreeBuilder(store, chunk_size=1 << 20, pack_size=2 << 20)
    add_directory(b, src)
    digest = b.finish()
    size = BlobLayout(fmt.decode(store.read(digest))).size
    # half the budget holds the image's blob and nothing beside it
    image_config = cfg(tmp_path, "n1").replace(store={"url": str(tmp_path / "image-store")},
                                               cache={"budget_bytes": 2 * size + 8192},
                                               mount={"backend": "erofs"})
    with Fetcher(image_config.fetch) as f:   # every chunk local: the blob is assembled
        reader = TreeReader(store, digest, f, NodeCache(image_config.cache))
        for c in reader.all_chunks():
            reader.chunk(c)
    mp = tmp_path / "image-mnt"
    mp.mkdir()
    handle, _, _ = mount_tree(image_config, digest, str(mp), str(tmp_path / "image-state"))
    try:
        assert handle.backend == "erofs-local"
        assert (mp / "weights.bin").read_bytes() == (src / "weights.bin").read_bytes()
    finally:
        handle.unmount()
    assert env_blob.exists()
    dead = cfg(tmp_path, "n1").replace(store={"url": "http://127.0.0.1:9/gone"})
    r = restore(published, tmp_path, "n1", config=dead)
    assert (r.how, r.form) == ("restored", "mount")
    assert run_py(prefix, "import bskern_one; print(bskern_one.X)") == "1"


def test_files_deleted_through_the_overlay_are_not_warm(published, tmp_path, caplog):
    """A job's ``rm -rf`` through the writable overlay leaves whiteouts over the published
    files: the next ensure is not "warm" with an empty environment; it mounts the
    environment again as published, drops the overlay's changes and says so."""
    urls, spec, prefix, key = published
    assert restore(published, tmp_path, "n1").how == "restored"
    site = f"{prefix}/lib/python3.11/site-packages"
    subprocess.run(["rm", "-rf", f"{site}/bskern_one", f"{prefix}/bin"], check=True)
    assert not os.path.exists(f"{prefix}/{MODULE}")
    with caplog.at_level("WARNING", logger="bootseer.deps.ensure"):
        r = restore(published, tmp_path, "n1")
    assert r.how == "restored"
    said = [x.getMessage() for x in caplog.records
            if "deleted through its overlay" in x.getMessage()]
    assert len(said) == 1 and "/lib/python3.11/site-packages/bskern_one" in said[0]
    assert run_py(prefix, "import bskern_one; print(bskern_one.X)") == "1"
    assert restore(published, tmp_path, "n1").how == "warm"


def test_a_ref_naming_another_keys_manifest_is_refused(published, tmp_path, index):
    """deps/env/<A> set to B's manifest: the manifest's own key is compared, and the
    restore refused (the node then builds A itself), never B restored as A."""
    from bootseer.deps.snapshot import env_ref, load_manifest
    from bootseer.store import open_store
    urls, spec, prefix, key = published
    store = open_store(str(tmp_path / "store"))
    other = "sha256:" + "b" * 64
    store.set_ref(env_ref(other), store.get_ref(env_ref(key)))   # A's ref -> B's manifest
    with pytest.raises(DepsError, match="names the manifest of environment"):
        load_manifest(store, store.get_ref(env_ref(other)), other)
    assert load_manifest(store, store.get_ref(env_ref(key)), key)["key"] == key
