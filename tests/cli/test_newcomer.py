"""What a newcomer's slips get: the closest name for a mistyped command, verb or option;
a listing with nothing in it that says so (and where to start); help that states each
default once."""

from __future__ import annotations

import json
import re

import pytest

from bootseer.cli.completion import _tree
from bootseer.cli.main import build_parser


@pytest.mark.parametrize("argv, near", [
    (["imgae", "ls"], "(did you mean image?)"),
    (["image", "lss"], "(did you mean ls?)"),
    (["image", "convert", "x", "--to", "s", "--chunk-sise", "1"], "(did you mean --chunk-size?)"),
    (["store", "ref", "gt", "x"], "(did you mean get?)"),
    # a required option mistyped: argparse says it is missing before it says the word is
    # unknown, so the hint goes beside the missing one
    (["deps", "key", "req.txt", "--prefx", "/x"], "required: --prefix (--prefx: did you mean "
                                                  "--prefix?)"),
])
def test_a_mistyped_name_gets_the_closest_one(world, argv, near):
    r = world.run(*argv)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith(near), r.stderr


def test_nothing_close_suggests_nothing(world):
    r = world.run("image", "convert", "x", "--to", "s", "--zzzzzz")
    assert r.returncode == 2 and "did you mean" not in r.stderr
    r = world.run("qqqqqq")
    assert r.returncode == 2 and "did you mean" not in r.stderr


@pytest.mark.parametrize("argv, says", [
    (["image", "ls"], "no converted images in"),
    (["deps", "ls"], "no published environments in"),
    (["store", "ls", "--refs"], "no refs in"),
    (["store", "ls", "--refs", "images/"], "no refs under 'images/' in"),
])
def test_an_empty_listing_says_so_on_stderr(world, argv, says):
    r = world.run(*argv)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert r.stderr.startswith(f"bootseer: {says} {world.store} (hint: "), r.stderr
    r = world.run(*argv, "--json")
    assert r.returncode == 0 and r.stderr == ""
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1 and not [v for k, v in doc.items() if k not in
                                      ("schema", "store") and v]


def test_an_empty_store_lists_no_blobs_and_says_so(world, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = world.run("store", "--store", str(empty), "ls")
    assert r.returncode == 0 and r.stdout == ""
    assert r.stderr.startswith(f"bootseer: no blobs in {empty} (hint: ")


def test_help_states_each_default_once():
    """The formatter adds ``(default: X)`` unless the help already speaks of its default."""
    twice = []
    for path, parser in _tree(build_parser()):
        entries = re.split(r"\n(?=  \S)", parser.format_help())
        for entry in entries:
            flat = re.sub(r"\s+", " ", entry)
            if len(re.findall(r"\(default", flat)) > 1:
                twice.append(f"bootseer {' '.join(path)}: {flat[:80]}")
    assert not twice, twice
