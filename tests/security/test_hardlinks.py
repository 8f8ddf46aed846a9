"""Issue 18 item 11: a hard link in a layer keeps the content it had in its layer, as an
overlay filesystem keeps it: a later layer's whiteout or replacement of the first name
changes nothing for the link (it was EIO, or the new content). Layers built on the fly."""

from __future__ import annotations

import functools
import os

import pytest

from bootseer.config import CacheConfig
from bootseer.image import convert
from bootseer.store import open_store
from bootseer.store.cache import NodeCache
from bootseer.store.fetch import Fetcher
from bootseer.tree.build import TreeBuilder, add_directory
from bootseer.tree.extract import extract
from bootseer.tree.reader import TreeReader
from tests.image.test_image import oci_layout, tar_layer

pytestmark = pytest.mark.timeout(60)
BASE = [("bin", None, "d"), ("bin/tool", b"OLD" * 1000, "f"), ("sbin", None, "d"),
        ("sbin/hard", None, "h:bin/tool")]


def tree_of(tmp_path, *layers) -> tuple[TreeReader, str]:
    store = open_store(str(tmp_path / "store"))
    digest = convert.convert(str(oci_layout(tmp_path / "img", [tar_layer(layer)
                                                                for layer in layers])), store)
    cache = NodeCache(CacheConfig(dir=str(tmp_path / "cache"), budget_bytes=1 << 30))
    return TreeReader(store, digest, Fetcher(), cache), digest


def restored(tmp_path, r: TreeReader):
    out = tmp_path / "out"
    extract(r, out)
    return out


def test_whiteout_of_the_first_name_keeps_the_link(tmp_path):
    r, _ = tree_of(tmp_path, BASE, [("bin/.wh.tool", b"", "f")])
    assert "/bin/tool" not in r.entries
    assert r.read("/sbin/hard", 10**6, 0) == b"OLD" * 1000
    assert (restored(tmp_path, r) / "sbin/hard").read_bytes() == b"OLD" * 1000


def test_replacing_the_first_name_leaves_the_link_its_content(tmp_path):
    r, _ = tree_of(tmp_path, BASE, [("bin/tool", b"NEW", "f")])
    assert r.read("/sbin/hard", 10**6, 0) == b"OLD" * 1000 and r.read("/bin/tool", 9, 0) == b"NEW"
    out = restored(tmp_path, r)
    assert (out / "sbin/hard").read_bytes() == b"OLD" * 1000
    assert os.stat(out / "sbin/hard").st_ino != os.stat(out / "bin/tool").st_ino


def test_untouched_links_stay_one_file(tmp_path):
    r, _ = tree_of(tmp_path, BASE, [("etc", None, "d"), ("etc/x", b"x", "f")])
    assert r.entries["/sbin/hard"].type == "h"
    out = restored(tmp_path, r)
    assert os.stat(out / "sbin/hard").st_ino == os.stat(out / "bin/tool").st_ino


@pytest.mark.parametrize("removal", [[("bin/.wh.tool", b"", "f")],        # the file
                                     [(".wh.bin", b"", "f")],             # its directory
                                     [("bin/.wh..wh..opq", b"", "f")]])   # opaque directory
def test_the_other_names_stay_linked_to_each_other(tmp_path, removal):
    base = BASE + [("sbin/hard2", None, "h:bin/tool"), ("usr", None, "d"),
                   ("usr/hard3", None, "h:sbin/hard")]   # a link to a link: the same file
    r, _ = tree_of(tmp_path, base, removal)
    for p in ("/sbin/hard", "/sbin/hard2", "/usr/hard3"):
        assert r.read(p, 10**6, 0) == b"OLD" * 1000, p
    out = restored(tmp_path, r)
    inodes = {os.stat(out / p.lstrip("/")).st_ino for p in ("/sbin/hard", "/sbin/hard2",
                                                             "/usr/hard3")}
    assert len(inodes) == 1 and os.stat(out / "sbin/hard").st_nlink == 3


def test_a_link_made_in_a_later_layer_keeps_that_layers_content(tmp_path):
    r, _ = tree_of(tmp_path, [("bin", None, "d"), ("bin/tool", b"V1", "f")],
                   [("bin/tool", b"V2", "f"), ("bin/keep", None, "h:bin/tool")],
                   [("bin/tool", b"V3", "f")])
    assert r.read("/bin/keep", 9, 0) == b"V2" and r.read("/bin/tool", 9, 0) == b"V3"


def _view(store_url, digest, cache_dir):
    from bootseer.tree.view import TreeMountView
    return TreeMountView(TreeReader(open_store(store_url), digest, Fetcher(),
                                    NodeCache(CacheConfig(dir=cache_dir, budget_bytes=1 << 30))))


def test_through_a_real_mount(need_fuse, tmp_path):
    from bootseer.mount.fuse import mount
    r, digest = tree_of(tmp_path, BASE + [("sbin/hard2", None, "h:bin/tool")],
                        [("bin/.wh.tool", b"", "f")])
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount(functools.partial(_view, r.store.url, digest, str(tmp_path / "cache")), str(mp)):
        assert (mp / "sbin/hard").read_bytes() == b"OLD" * 1000   # was EIO
        assert os.stat(mp / "sbin/hard2").st_nlink == 2
        assert not (mp / "bin/tool").exists()


def test_restore_links_a_name_that_sorts_before_its_first_name(tmp_path):
    """A directory snapshot records the first name the walk met (``/a/c``) and links the
    later one (``/a/b/x``), which sorts before it: restore writes whichever comes first."""
    src = tmp_path / "src"
    (src / "a/b").mkdir(parents=True)
    (src / "a/c").write_bytes(b"same")
    os.link(src / "a/c", src / "a/b/x")
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store)
    add_directory(b, src)
    assert b.entries["/a/b/x"].type == "h"
    r = TreeReader(store, b.finish(), Fetcher())
    out = restored(tmp_path, r)
    assert (out / "a/b/x").read_bytes() == b"same"
    assert os.stat(out / "a/b/x").st_ino == os.stat(out / "a/c").st_ino
