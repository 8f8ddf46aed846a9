"""``store gc`` removes only what nothing reaches: never a blob a ref, a tree or a profile
reaches, never a fresh one."""

from __future__ import annotations

import json

from bootseer.store import open_store
from tests.cli.conftest import DIGEST_OF_HI


def _image_store(world):
    """A store with a converted image, its pushed profile, and one orphan blob (``hi``,
    put by the world, no ref)."""
    from tests.image.test_image import oci_layout, tar_layer
    layer = tar_layer([("bin", None, "d"), ("bin/tool", b"T" * 5000, "f"),
                       ("etc", None, "d"), ("etc/a", b"A" * 100, "f")])
    oci_layout(world.root / "img", [layer])
    r = world.run("image", "convert", "img", "--chunk-size", "1KiB")
    assert r.returncode == 0, r.stderr
    tree = r.stdout.strip()
    store = open_store(str(world.store))
    toc_chunks = list(_toc(store, tree).files())
    profile = {"kind": "bootseer.profile", "tree": tree, "runs": 1,
               "chunks": [[e.chunks[0].digest, 0, 1, e.path, e.chunks[0].size]
                          for e in toc_chunks]}
    (world.root / "profile.json").write_text(json.dumps(profile))
    r = world.run("image", "profile", "push", "profile.json")
    assert r.returncode == 0, r.stderr
    return store, tree


def _toc(store, tree):
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import load_toc
    with Fetcher() as f:
        return load_toc(store, tree, f)


def _gc(world, *args):
    r = world.run("store", "gc", "--json", *args)
    assert r.returncode == 0, r.stderr
    return [b["digest"] for b in json.loads(r.stdout)["blobs"]]


def test_gc_removes_only_unreferenced_blobs(world):
    store, tree = _image_store(world)
    before = set(store.list())
    assert _gc(world) == []                                    # all fresh: --min-age 24h
    assert _gc(world, "--dry-run", "--min-age", "0") == [DIGEST_OF_HI]
    assert set(store.list()) == before                         # a dry run removes nothing
    assert _gc(world, "--min-age", "0") == [DIGEST_OF_HI]
    assert set(store.list()) == before - {DIGEST_OF_HI}
    # what is left is whole: the tree reads, every pack it names is there
    toc = _toc(store, tree)
    assert all(store.exists(p) for p in toc.packs)
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import TreeReader
    with Fetcher() as f:
        assert TreeReader(store, tree, f).read("/bin/tool", 5000, 0) == b"T" * 5000
    shown = world.run("image", "profile", "show", tree)
    assert shown.returncode == 0 and "2 hot chunks" in shown.stdout, shown.stderr


def test_a_tree_no_ref_reaches_any_more_is_unreferenced(world):
    store, tree = _image_store(world)
    for name in list(store.list_refs("")):
        store.delete_ref(name)
    listed = set(_gc(world, "--dry-run", "--min-age", "0"))
    assert listed == set(store.list()) and tree in listed


def test_gc_refuses_a_store_it_cannot_remove_from(world):
    r = world.run("store", "gc", "--store", "http://127.0.0.1:9/store")
    assert r.returncode == 2 and "directory stores only" in r.stderr
    r = world.run("store", "gc", "--min-age", "soon")
    assert r.returncode == 2 and "is not an age" in r.stderr
