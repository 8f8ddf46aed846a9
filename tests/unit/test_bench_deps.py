"""bench/deps's pure helpers: the wheelhouse key of a pin set, what serves the prefix read
from a node's mount table, and the numbers read back from a node's output."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "deps"))

import stacks

PREFIX = "/opt/bsbench-deps/env"
NODE = "/var/tmp/bootseer-x/n3"
ROOTS = (NODE, "/opt/bsbench-deps")
BASE = ("22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "600 22 254:0 /var/tmp/bootseer-x/n3/opt /opt/bsbench-deps rw - ext4 /dev/vda rw\n")


def test_pin_set_key_ignores_order_and_name_spelling_but_not_versions():
    a = stacks.pin_set_key(["numpy==2.2.6", "PyYAML==6.0.2"])
    assert a == stacks.pin_set_key(["pyyaml==6.0.2", "numpy==2.2.6"])
    assert a == stacks.pin_set_key(["NumPy==2.2.6", "pyyaml==6.0.2 "])
    assert a != stacks.pin_set_key(["numpy==2.2.5", "PyYAML==6.0.2"])
    assert a != stacks.pin_set_key(["numpy==2.2.6"])
    assert stacks.wheelhouse_name("large", ["numpy==2.2.6", "PyYAML==6.0.2"]) == f"large-{a}"


def test_pin_set_key_normalizes_project_names_as_pep_503():
    assert stacks.pin_set_key(["Typing_Extensions==4.16.0"]) == \
        stacks.pin_set_key(["typing-extensions==4.16.0"])


def test_stacks_are_exact_pins_and_the_large_one_is_large():
    for s in stacks.STACKS.values():
        assert all("==" in p for p in s.pins)
        names = [stacks._project(p) for p in s.pins]
        assert len(names) == len(set(names)), f"{s.name} pins a project twice"
    assert len(stacks.LARGE.pins) >= 50


def test_backend_directory_when_nothing_is_mounted_at_the_prefix():
    assert stacks.env_backend(BASE, PREFIX, ROOTS) == "directory"


def test_backend_erofs_on_a_local_blob_and_on_a_fuse_served_blob():
    erofs = BASE + f"610 600 0:90 / {PREFIX} ro,nosuid,nodev - erofs /n3/cache/m.erofs ro\n"
    assert stacks.env_backend(erofs, PREFIX, ROOTS) == "erofs"
    fuse_blob = (BASE + f"605 22 0:88 / {NODE}/cache/blobs/x rw - fuse.bootseer bootseer rw\n"
                 + erofs.splitlines()[-1] + "\n")
    assert stacks.env_backend(fuse_blob, PREFIX, ROOTS) == "erofs+fuse-blob"
    # the lazy mount's blob server sits beside the prefix; a FUSE mount of the host's
    # copied into the node's namespace is not the node's
    beside = BASE + "605 22 0:88 / /opt/bsbench-deps/.env.bootseer/blob rw - fuse.b b rw\n"
    assert stacks.env_backend(beside + erofs.splitlines()[-1], PREFIX, ROOTS) == \
        "erofs+fuse-blob"
    host = BASE + "605 22 0:88 / /var/lib/other/fuse rw - fuse.other x rw\n"
    assert stacks.env_backend(host + erofs.splitlines()[-1], PREFIX, ROOTS) == "erofs"


def test_backend_names_a_writable_overlay_over_erofs():
    lower = f"{NODE}/cache/erofs/mnt/k"
    over = (BASE + f"610 22 0:90 / {lower} ro,nosuid,nodev - erofs {NODE}/cache/m.erofs ro\n"
            f"611 600 0:91 / {PREFIX} rw - overlay overlay rw,lowerdir={lower}\n")
    assert stacks.env_backend(over, PREFIX, ROOTS) == "overlay+erofs"
    blob = BASE + f"605 22 0:88 / {NODE}/cache/blob rw - fuse.bootseer bootseer rw\n"
    assert stacks.env_backend(blob + over.split("\n", 2)[2], PREFIX, ROOTS) == \
        "overlay+erofs+fuse-blob"


def test_backend_fuse_views_and_other_filesystems():
    view = BASE + f"610 600 0:90 / {PREFIX} ro - fuse.bootseer-deps bootseer ro\n"
    assert stacks.env_backend(view, PREFIX, ROOTS) == "fuse"
    squash = (BASE + f"610 600 0:90 / {PREFIX} ro - squashfs img ro\n"
              f"611 610 0:91 / {PREFIX} rw - overlay overlay rw\n")
    assert stacks.env_backend(squash, PREFIX, ROOTS) == "overlay+squashfs"


def test_backend_reads_escaped_mount_points():
    spaced = BASE + "610 600 0:90 / /opt/a\\040b ro - erofs img ro\n"
    assert stacks.env_backend(spaced, "/opt/a b", ROOTS) == "erofs"


def test_parse_marks_reads_the_marks_among_tool_output():
    out = ("Resolved 8 packages\nSTEP 2190000\n[transformers] PyTorch was not found.\n"
           "IMPORT 1.25\nSTEPS are not marks\nHOT oops\nHOT 0.5\n")
    assert stacks.parse_marks(out) == {"STEP": [2190000.0], "IMPORT": [1.25], "HOT": [0.5]}


def test_ensure_json_takes_the_result_line_and_ignores_other_json():
    out = ('{"progress": 1}\n{"schema": 1, "how": "restored", "key": "sha256:ab", '
           '"prefix": "/p", "backend": "erofs"}\nSTEP 5\n{not json\n')
    assert stacks.ensure_json(out)["backend"] == "erofs"
    assert stacks.ensure_json("uv output only\nSTEP 5\n") == {}
    indented = 'uv says\n{\n "schema": 1,\n "how": "warm",\n "form": "mount"\n}\nSTEP 9\n'
    assert stacks.ensure_json(indented) == {"schema": 1, "how": "warm", "form": "mount"}


def test_ratio_line_says_met_or_missed():
    assert stacks.ratio_line("restore", 0.42, 0.5) == "restore 0.42x (goal <= 0.5x: met)"
    assert stacks.ratio_line("warm", 0.25, 0.1, " s") == "warm 0.25 s (goal <= 0.1 s: missed)"


def test_parse_figures_keeps_the_window_numbers():
    out = ('published\nFIGURES {"tree": "sha256:ab", "coverage": 0.97, "precision": null, '
           '"stall_s": 1.5, "demand_chunks": 12, "prefetch": {"chunks": 40}}\n')
    assert stacks.parse_figures(out) == {"coverage": 0.97, "stall_s": 1.5, "demand_chunks": 12}
    assert stacks.parse_figures("FIGURES \n") == {}
    assert stacks.parse_figures("FIGURES {broken\n") == {}
