"""Lazy restores (``mount.env_lazy``): the environment mounted while its blob is filled
from the store, and what is left: the node's verified blob and record, so the next
restore is the local kernel mount. Faults: a fill killed midway, a chunk that fails its
digest. Real index (nginx), real uv, a rate-limited store, real EROFS and FUSE."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from bootseer.deps import blobs
from bootseer.deps import ensure as E
from bootseer.deps.mounts import unmount
from bootseer.deps.prefix import rmtree, sidecar, sidecar_info, state_dir
from bootseer.node import mounts as points
from bootseer.node.proc import pid_alive
from tests.deps.test_deps import cfg, serve_index
from tests.deps.test_deps_kernel import BOTH, MODULE, PY, cli, restore, run_py

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("need_root")]
BIG = 2 << 20   # a module the start never imports: the fill's bytes, not the job's


@pytest.fixture
def published(nginx_factory, tmp_path):
    """The kernel tests' two packages and a large one nothing imports, built and
    published at ``<tmp>/env`` by n0, the prefix then emptied: (urls, spec, prefix, key)."""
    big = f"DATA = {os.urandom(BIG // 2).hex()!r}\n"   # hex: about 2x compressible
    urls, spec = serve_index(nginx_factory, tmp_path,
                             [("bskern_one", "1.0", "X = 1\n"), ("bskern_two", "1.0", "Y = 2\n"),
                              ("bslazy_big", "1.0", big)],
                             "bskern-one==1.0\nbskern-two==1.0\nbslazy-big==1.0\n")
    prefix = str(tmp_path / "env")
    built = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n0"))
    assert built.how == "built"
    rmtree(prefix)
    yield urls, str(spec), prefix, built.key
    if os.path.exists(sidecar(prefix)):
        unmount(prefix)


def lazy_cfg(tmp_path, node: str, url: str):
    return cfg(tmp_path, node).replace(store={"url": url}, mount={"env_lazy": True})


def erofs_dir(tmp_path, node: str) -> Path:
    return tmp_path / node / "cache" / "erofs"


def wait_for(cond, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_lazy_restore_serves_before_the_fill_ends_and_leaves_the_nodes_blob(
        published, tmp_path, nginx_factory):
    urls, spec, prefix, key = published
    slow = nginx_factory(tmp_path / "store", limit_rate="128k")   # the fill takes seconds
    t = time.monotonic()
    r = restore(published, tmp_path, "n1", config=lazy_cfg(tmp_path, "n1", slow.url))
    assert (r.how, r.form) == ("restored", "mount")
    info = sidecar_info(prefix)
    assert info and pid_alive(info["server_pid"])
    assert points.find(f"{state_dir(prefix)}/lower").fstype == "erofs"
    # the right bytes while the blob is still partial on the node
    assert run_py(prefix, BOTH) == "3"
    assert Path(prefix, MODULE).read_text() == "X = 1\n"
    assert not list(erofs_dir(tmp_path, "n1").glob("*.blob")), "filled before reading"
    # the fill ends with the blob a whole restore leaves: verified, recorded
    wait_for(lambda: blobs.cached_blob(lazy_cfg(tmp_path, "n1", slow.url), key) is not None)
    rec = blobs.cached_blob(cfg(tmp_path, "n1"), key)
    assert rec and blobs.verified_unchanged(rec["blob"]) and os.path.exists(rec["meta"])
    print(f"lazy restore {time.monotonic() - t:.2f} s, blob {os.path.getsize(rec['blob'])} B")
    assert run_py(prefix, BOTH) == "3"                        # served from the local blob
    assert cli("deps", "umount", prefix).returncode == 0
    assert not pid_alive(info["server_pid"]) and not os.path.exists(state_dir(prefix))
    assert not points.is_mount_point(f"{state_dir(prefix)}/blobfs")
    # the next restore on the node: the local kernel mount, no store asked
    dead = lazy_cfg(tmp_path, "n1", "http://127.0.0.1:9/gone")
    r = restore(published, tmp_path, "n1", config=dead)
    assert (r.how, r.form) == ("restored", "mount")
    assert (sidecar_info(prefix) or {}).get("server_pid") is None
    assert sidecar_info(prefix)["blob"] == rec["blob"]
    assert run_py(prefix, BOTH) == "3"


def test_a_fill_killed_midway_leaves_no_whole_blob_and_the_next_ensure_completes_it(
        published, tmp_path, nginx_factory):
    urls, spec, prefix, key = published
    slow = nginx_factory(tmp_path / "store", limit_rate="16k")
    conf = lazy_cfg(tmp_path, "n1", slow.url)
    restore(published, tmp_path, "n1", config=conf)
    server = sidecar_info(prefix)["server_pid"]
    erofs = erofs_dir(tmp_path, "n1")
    assert [p for p in erofs.iterdir() if ".part-" in p.name]
    killed = children(server) + [server]
    for pid in killed:   # the blob's FUSE server first: it cleans nothing up
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(map(pid_alive, killed)))
    assert not list(erofs.glob("*.blob")) and blobs.cached_blob(conf, key) is None
    # not warm (its server is dead): mounted again, and this fill completes
    fast = lazy_cfg(tmp_path, "n1", str(tmp_path / "store"))
    r = restore(published, tmp_path, "n1", config=fast)
    assert (r.how, r.form) == ("restored", "mount")
    assert run_py(prefix, BOTH) == "3"
    wait_for(lambda: blobs.cached_blob(fast, key) is not None)
    assert blobs.verified_unchanged(blobs.cached_blob(fast, key)["blob"])
    wait_for(lambda: not [p for p in erofs.iterdir() if ".part-" in p.name])
    assert cli("deps", "umount", prefix).returncode == 0


def test_a_chunk_failing_its_digest_is_never_served(published, tmp_path):
    urls, spec, prefix, key = published
    store = tmp_path / "store"
    # every pack corrupted in its middle: each chunk there fails to decompress or verify
    packs = [p for p in store.rglob("*") if p.is_file() and p.stat().st_size > 4096
             and "refs" not in p.parts and not _is_json(p)]
    assert packs
    for p in packs:
        data = bytearray(p.read_bytes())
        for i in range(len(data) // 3, len(data) * 2 // 3, 512):
            data[i] ^= 0xFF
        p.write_bytes(bytes(data))
    conf = lazy_cfg(tmp_path, "n1", str(store))
    r = restore(published, tmp_path, "n1", config=conf)
    assert r.form == "mount"
    with pytest.raises(OSError):
        for root, _, files in os.walk(prefix):
            for f in files:
                if os.path.isfile(os.path.join(root, f)):
                    Path(root, f).read_bytes()
    time.sleep(1)
    assert not list(erofs_dir(tmp_path, "n1").glob("*.blob"))
    assert blobs.cached_blob(conf, key) is None
    assert cli("deps", "umount", prefix).returncode == 0
    assert not [p for p in erofs_dir(tmp_path, "n1").iterdir() if ".part-" in p.name]


def _is_json(p: Path) -> bool:
    try:
        json.loads(p.read_bytes())
        return True
    except ValueError:
        return False


def test_a_blob_server_that_cannot_start_falls_back_to_the_whole_blob(published, tmp_path,
                                                                      caplog):
    urls, spec, prefix, key = published
    state = Path(state_dir(prefix))
    state.mkdir(parents=True)
    (state / "blobfs").write_text("not a directory")   # where the server mounts the blob
    conf = lazy_cfg(tmp_path, "n1", str(tmp_path / "store"))
    r = restore(published, tmp_path, "n1", config=conf)
    assert (r.how, r.form) == ("restored", "mount")
    assert "fetching the whole blob instead" in caplog.text
    assert (sidecar_info(prefix) or {}).get("server_pid") is None
    assert blobs.cached_blob(conf, key) is not None          # fetched before the mount
    assert run_py(prefix, BOTH) == "3"
    assert cli("deps", "umount", prefix).returncode == 0
    (state / "blobfs").unlink()
