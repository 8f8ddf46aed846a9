"""``image rm``: a converted image's names go, its blobs stay until ``store gc``; a tree
another name still has keeps its manifest ref and profile."""

from __future__ import annotations

import json

from tests.cli.conftest import error_lines
from tests.cli.test_store_gc import _image_store


def _refs(world) -> set[str]:
    r = world.run("store", "ls", "--refs", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    return {ref["name"] if isinstance(ref, dict) else ref for ref in doc.get("refs", [])}


def test_rm_removes_the_refs_and_gc_then_reclaims(world):
    store, tree = _image_store(world)
    before = _refs(world)
    assert {"images/by-name/img", f"images/profile/{tree[7:]}"} <= before
    r = world.run("image", "rm", "img", "--json")
    assert r.returncode == 0, r.stderr
    removed = json.loads(r.stdout)["removed"]
    assert removed[0] == "images/by-name/img"
    assert f"images/profile/{tree[7:]}" in removed
    assert any(n.startswith("images/by-manifest/") for n in removed)
    assert store.exists(tree)                        # the blobs stay...
    assert json.loads(world.run("image", "ls", "--json").stdout)["images"] == []
    gc = world.run("store", "gc", "--min-age", "0s", "--json")
    assert gc.returncode == 0, gc.stderr
    assert not store.exists(tree)                    # ...until gc reclaims them


def test_a_tree_with_another_name_keeps_its_profile(world):
    store, tree = _image_store(world)
    r = world.run("store", "ref", "set", "images/by-name/img2", tree)   # a second name
    assert r.returncode == 0, r.stderr
    r = world.run("image", "rm", "img")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["removed images/by-name/img"]
    assert store.get_ref(f"images/profile/{tree[7:]}") is not None
    r = world.run("image", "rm", tree)               # by digest: every name of the tree
    assert r.returncode == 0, r.stderr
    assert "removed images/by-name/img2" in r.stdout
    assert store.get_ref(f"images/profile/{tree[7:]}") is None


def test_rm_of_an_unknown_image_removes_nothing(world):
    _image_store(world)
    r = world.run("image", "rm", "img", "never/converted:v1")
    assert r.returncode == 1 and "never/converted:v1" in error_lines(r)[0]
    assert "Traceback" not in r.stderr
    assert "images/by-name/img" in _refs(world)
