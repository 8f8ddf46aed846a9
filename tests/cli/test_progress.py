"""Progress bars with totals on a terminal for ``image prefetch`` and ``ckpt prefetch``
(standard error is a real pty here); none with ``-q``/``--no-progress``, and none when
standard error is not a terminal."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from tests.cli.conftest import World

pytestmark = pytest.mark.timeout(120)


def on_a_terminal(world: World, *argv: str) -> tuple[int, str, str]:
    """Run bootseer with standard error on a pty of 100 columns: (exit code, stdout, what
    the terminal showed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    try:
        proc = subprocess.Popen([sys.executable, "-m", "bootseer", *argv], cwd=world.root,
                                env=world.env, stdout=subprocess.PIPE,
                                stderr=slave, stdin=subprocess.DEVNULL)
    finally:
        os.close(slave)
    shown = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:   # EIO: the child closed its end
            break
        if not data:
            break
        shown += data
    out = proc.stdout.read().decode()
    proc.wait(60)
    os.close(master)
    return proc.returncode, out, shown.decode(errors="replace")


@pytest.fixture
def hot_image(world):
    """A converted image (48 chunks of 64 KiB) whose profile names every chunk."""
    from bootseer.store import open_store
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import load_toc
    from tests.image.test_image import oci_layout, tar_layer
    oci_layout(world.root / "img", [tar_layer([("data", os.urandom(48 * 65536), "f")])])
    r = world.run("image", "convert", "img", "--chunk-size", "64KiB")
    assert r.returncode == 0, r.stderr
    tree = r.stdout.split()[-1]
    with Fetcher() as f:
        toc = load_toc(open_store(str(world.store)), tree, f)
    chunks = [c for e in toc.entries for c in e.chunks or ()]
    profile = {"v": 1, "kind": "bootseer.profile", "tree": tree, "runs": 1,
               "chunks": [[c.digest, i, 1, "/data", c.size, 1] for i, c in enumerate(chunks)]}
    (world.root / "profile.json").write_text(json.dumps(profile))
    assert world.run("image", "profile", "push", "profile.json").returncode == 0
    return tree, len(chunks)


def test_image_prefetch_shows_a_bar_with_its_total(world, hot_image):
    tree, n = hot_image
    rc, out, shown = on_a_terminal(world, "image", "prefetch", tree)
    assert rc == 0, shown
    assert json.loads(out)["planned_chunks"] == n == 48
    assert "prefetch" in shown and "100%" in shown and f"{n}/{n}" in shown, shown


@pytest.mark.parametrize("flag", ["-q", "--no-progress"])
@pytest.mark.parametrize("where", ["before the command", "after the verb"])
def test_image_prefetch_bar_is_off_when_asked(world, hot_image, flag, where):
    tree, _ = hot_image
    argv = ([flag, "image", "prefetch", tree] if where == "before the command"
            else ["image", "prefetch", tree, flag])
    rc, _, shown = on_a_terminal(world, *argv)
    assert rc == 0 and "%" not in shown, shown


def _checkpoint(world) -> str:
    ckpt = world.root / "model"   # (world.root/ckpt is the node's staging area)
    ckpt.mkdir()
    (ckpt / "a.bin").write_bytes(os.urandom(3_000_000))
    (ckpt / "b.bin").write_bytes(os.urandom(1_000_000))
    return f"file://{ckpt}"


def test_ckpt_prefetch_shows_a_bar_with_its_total(world):
    rc, out, shown = on_a_terminal(world, "ckpt", "prefetch", _checkpoint(world))
    assert rc == 0, shown
    assert json.loads(out)["failed"] == 0
    assert "ckpt prefetch" in shown and "100%" in shown and "4.00M/4.00M" in shown, shown
    assert "plan from the file list" in shown            # the status line stays


def test_ckpt_prefetch_quiet_and_not_a_terminal(world):
    url = _checkpoint(world)
    rc, _, shown = on_a_terminal(world, "-q", "ckpt", "prefetch", url)
    assert rc == 0 and shown.strip() == "", shown
    piped = world.run("ckpt", "prefetch", url)
    assert piped.returncode == 0 and "%" not in piped.stderr, piped.stderr


def test_convert_shows_the_layers_of_their_total(world):
    from tests.image.test_image import oci_layout, tar_layer
    oci_layout(world.root / "img", [tar_layer([("a", os.urandom(300_000), "f")]),
                                    tar_layer([("b", os.urandom(200_000), "f")])])
    rc, out, shown = on_a_terminal(world, "image", "convert", "img")
    assert rc == 0 and out.startswith("sha256:"), shown
    assert "layers: 100%" in shown, shown


@pytest.mark.parametrize("multi_platform", [False, True])
def test_convert_shows_the_registry_pull_of_its_total(world, registry, multi_platform):
    from tests.image.test_convert_registry import multi_platform_layout, need_skopeo, push
    from tests.image.test_image import oci_layout, tar_layer
    need_skopeo()
    ref = f"127.0.0.1:{registry.port}/team/bar:1"
    if multi_platform:   # the total is the chosen platform's manifest's, not the index's
        push(f"oci:{multi_platform_layout(world.root / 'multi')}:multi", ref,
             all_platforms=True)
    else:
        oci_layout(world.root / "img", [tar_layer([("a", os.urandom(2_000_000), "f")])])
        push(f"oci:{world.root / 'img'}", ref)
    rc, out, shown = on_a_terminal(world, "image", "convert", ref, "--no-referrer")
    assert rc == 0 and out.startswith("sha256:"), shown
    assert "pull: 100%" in shown and "layers: 100%" in shown, shown
    rc, _, shown = on_a_terminal(world, "--no-progress", "image", "convert", ref,
                                 "--no-referrer")
    assert rc == 0 and "pull" not in shown and "%" not in shown, shown
