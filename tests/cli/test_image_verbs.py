"""``image ls`` and ``image inspect``: what a store holds, from its refs and TOCs."""

from __future__ import annotations

import json

from tests.cli.test_store_gc import _image_store


def test_image_ls_and_inspect(world):
    _, tree = _image_store(world)
    r = world.run("image", "ls", "--json")
    assert r.returncode == 0, r.stderr
    images = json.loads(r.stdout)["images"]
    assert [i["tree"] for i in images] == [tree] and images[0]["name"].endswith("img")
    r = world.run("image", "inspect", "img", "--json")     # by the name it was converted as
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1 and doc["tree"] == tree
    assert (doc["size"], doc["files"], doc["chunks"]) == (5100, 2, 6)   # 5 + 1 KiB chunks
    assert doc["packs"] >= 1 and doc["packed_bytes"] > 0
    assert doc["meta"]["source"] == "img"
    assert doc["profile"] == {"chunks": 2, "bytes": 1024 + 100, "runs": 1,
                              "coverage": round(1124 / 5100, 4)}
    text = world.run("image", "inspect", tree).stdout
    assert "profile     2 hot chunks" in text and "(22.0% of the data)" in text


def test_inspect_of_an_unknown_image_is_one_line(world):
    r = world.run("image", "inspect", "never/converted:v1")
    assert r.returncode == 1 and r.stderr.startswith("bootseer: error: no converted image")
