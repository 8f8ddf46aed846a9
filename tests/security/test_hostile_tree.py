"""Issue 18 item 4: a tree from the store is untrusted. A forged TOC (paths leaving the
tree, an entry under an in-tree symlink, set-id bits) is refused whole at restore and at
mount, with one line naming the path; nothing is written outside the target."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys

import pytest

from bootseer.config import BootseerConfig, CacheConfig, FetchConfig, StoreConfig
from bootseer.store import open_store
from bootseer.store.cache import NodeCache
from bootseer.store.fetch import Fetcher
from bootseer.tree import validate
from bootseer.tree.extract import extract
from bootseer.tree.format import TreeFormatError
from bootseer.tree.reader import TreeReader
from tests.security.hostile import entry, forged_tree

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def outside(tmp_path):
    """A directory outside every target: the forged trees aim at it."""
    d = tmp_path / "outside"
    d.mkdir()
    return d


def hostile_cases(outside) -> dict[str, tuple[list[dict], str]]:
    """name -> (forged entries, the path the refusal must name)."""
    o = str(outside)
    return {
        "dotdot": ([entry("/../../" + o.lstrip("/") + "/dotdot")],
                   "/../../" + o.lstrip("/") + "/dotdot"),
        "relative": ([entry(o.lstrip("/") + "/rel")], o.lstrip("/") + "/rel"),
        "dot-component": ([entry("/./ok2")], "/./ok2"),
        "empty-component": ([entry("//ok2")], "//ok2"),
        "nul": ([entry("/a\0b")], "/a\0b"),
        "duplicate": ([entry("/ok")], "/ok"),
        "under-symlink": ([entry("/link", "l", target=o, size=len(o)),
                           entry("/link/pwned")], "/link/pwned"),
        "under-file": ([entry("/ok/x")], "/ok/x"),
        "hardlink-out": ([entry("/h", "h", target="/../../etc/passwd")], "/h"),
        "hardlink-to-dir": ([entry("/d", "d"), entry("/h", "h", target="/d")], "/h"),
        "no-parent": ([entry("/nodir/x")], "/nodir/x"),
    }


CASES = ["dotdot", "relative", "dot-component", "empty-component", "nul", "duplicate",
         "under-symlink", "under-file", "hardlink-out", "hardlink-to-dir", "no-parent"]


def config(tmp_path, store_url: str) -> BootseerConfig:
    return BootseerConfig(store=StoreConfig(url=store_url),
                          cache=CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30),
                          fetch=FetchConfig(retries=1, backoff_s=0.01))


def restore(tmp_path, store, tree: str, prefix) -> None:
    """The real environment restore (deps ensure's path) of ``tree`` at ``prefix``."""
    from bootseer.deps.restore import extract as deps_restore
    deps_restore(store, {"prefix": str(prefix), "tree": tree}, str(prefix),
                 config(tmp_path, store.url), key="k" * 64)


def written_outside(outside) -> list[str]:
    return sorted(os.listdir(outside))


@pytest.mark.parametrize("case", CASES)
def test_restore_refuses_a_forged_tree_and_writes_nothing_outside(tmp_path, outside, case):
    store = open_store(str(tmp_path / "store"))
    extra, named = hostile_cases(outside)[case]
    tree = forged_tree(store, extra)
    prefix = tmp_path / "env"
    with pytest.raises(TreeFormatError) as e:
        restore(tmp_path, store, tree, prefix)
    msg = str(e.value)
    assert "\n" not in msg and "is refused" in msg and repr(named) in msg, msg
    assert written_outside(outside) == [] and not prefix.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith("env.")]   # no leftovers


def test_restore_beneath_directory_fds_even_without_the_check(tmp_path, outside, monkeypatch):
    """Defence in depth: with the TOC check switched off, restore still cannot be led
    through an in-tree symlink or out of the target: it creates every entry relative to a
    directory it made itself, and refuses what has no such directory."""
    store = open_store(str(tmp_path / "store"))
    o = str(outside)
    for i, extra in enumerate([
            [entry("/link", "l", target=o, size=len(o)), entry("/link/pwned")],
            [entry("/../../" + o.lstrip("/") + "/dotdot")],
            [entry(o + "/abs")]]):
        tree = forged_tree(store, extra)
        monkeypatch.setattr(validate, "check", lambda toc, digest="": None)
        r = TreeReader(store, tree, Fetcher(), NodeCache(CacheConfig(
            dir=str(tmp_path / "cache"), budget_bytes=1 << 30)))
        monkeypatch.undo()
        with pytest.raises(OSError):
            extract(r, tmp_path / f"out{i}")
        assert written_outside(outside) == []


def _capability_blob() -> bytes:
    """A valid VFS_CAP_REVISION_2 security.capability value (cap_net_raw, effective)."""
    return struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)


def test_environment_restore_drops_set_id_bits_and_capabilities(need_root, tmp_path):
    import base64
    store = open_store(str(tmp_path / "store"))
    cap = base64.b64encode(_capability_blob()).decode()
    tree = forged_tree(store, [
        entry("/bin", "d", mode=0o2775),
        entry("/bin/su", mode=0o4755, uid=0, gid=0,
              xattrs={"security.capability": cap, "user.note": "aGk="}),
        entry("/bin/sg", mode=0o2755)])
    prefix = tmp_path / "env"
    restore(tmp_path, store, tree, prefix)
    su, sg = os.stat(prefix / "bin/su"), os.stat(prefix / "bin/sg")
    assert stat.S_IMODE(su.st_mode) & 0o6000 == 0 and stat.S_IMODE(sg.st_mode) & 0o6000 == 0
    assert stat.S_IMODE(os.stat(prefix / "bin").st_mode) & 0o6000 == 0
    assert (prefix / "bin/su").read_bytes() == b"owned\n"
    assert os.listxattr(prefix / "bin/su") == ["user.note"]   # no file capability
    # an image pull may keep them (its mount is nosuid): only when asked
    r = TreeReader(store, tree, Fetcher(), NodeCache(CacheConfig(dir=str(tmp_path / "cache"))))
    extract(r, tmp_path / "img", keep_privileges=True)
    assert stat.S_IMODE(os.stat(tmp_path / "img/bin/su").st_mode) == 0o4755
    assert os.getxattr(tmp_path / "img/bin/su", "security.capability") == _capability_blob()


@pytest.mark.parametrize("case", ["under-symlink", "dotdot", "hardlink-out"])
def test_mount_refuses_a_forged_tree_before_mounting(need_fuse, tmp_path, outside, case):
    from bootseer.tree.session import mount_tree
    store = open_store(str(tmp_path / "store"))
    extra, named = hostile_cases(outside)[case]
    tree = forged_tree(store, extra)
    mp = tmp_path / "mnt"
    mp.mkdir()
    with pytest.raises(TreeFormatError, match="is refused"):
        mount_tree(config(tmp_path, store.url), tree, str(mp), str(tmp_path / "state"))
    assert not os.path.ismount(mp) and written_outside(outside) == []


def test_mount_server_refuses_a_forged_tree_too(need_fuse, tmp_path, outside):
    """The FUSE server loads the TOC itself (the caller's check could be skipped or the
    cache changed under it): it refuses the tree and nothing is mounted."""
    import functools

    from bootseer.mount.fuse import MountError, mount
    from bootseer.tree.session import _session_view
    store = open_store(str(tmp_path / "store"))
    tree = forged_tree(store, hostile_cases(outside)["under-symlink"][0])
    mp = tmp_path / "mnt"
    mp.mkdir()
    factory = functools.partial(_session_view, config(tmp_path, store.url), tree,
                                str(tmp_path / "state"), False, None, 5.0)
    with pytest.raises(MountError, match="lies under '/link', which is a symlink"):
        mount(factory, str(mp)).unmount()
    assert not os.path.ismount(mp)


def test_cli_says_one_line(need_fuse, tmp_path, outside):
    store = open_store(str(tmp_path / "store"))
    tree = forged_tree(store, hostile_cases(outside)["under-symlink"][0])
    mp = tmp_path / "mnt"
    mp.mkdir()
    env = {**os.environ, "BOOTSEER_STORE_URL": store.url,
           "BOOTSEER_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "bootseer", "image", "mount", tree, str(mp)],
                       capture_output=True, text=True, env=env, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(lines) == 1, p.stderr
    assert lines[0].startswith("bootseer: error: ") and "'/link/pwned'" in lines[0]
    assert not os.path.ismount(mp)


@pytest.mark.parametrize("forge, why", [
    (lambda e: e.update(size=e["size"] + 1), "for a size of"),          # a longer file
    (lambda e: e["chunks"][0].__setitem__(1, 7), "names pack 7"),         # a pack not listed
    (lambda e: e["chunks"][0].__setitem__(0, "sha256:../x"), "malformed chunk reference"),
    (lambda e: e.update(mode=0o170755), "mode bits beyond"),
    (lambda e: e.update(uid=-1), "invalid uid"),
    (lambda e: e.update(xattrs={"user.x": 1}), "malformed xattrs"),
    (lambda e: e.update(type="x"), "unknown type")])
def test_a_forged_file_entry_is_refused_at_load(tmp_path, forge, why):
    from tests.security.hostile import put_toc, raw_toc
    store = open_store(str(tmp_path / "store"))
    toc = raw_toc(store, forged_tree(store, []))
    forge(next(e for e in toc["entries"] if e["path"] == "/ok"))
    with pytest.raises(TreeFormatError, match=why):
        TreeReader(store, put_toc(store, toc), Fetcher())
