"""Issue 18 item 13: a read-only store (a read-only mount, a mirror) is a normal case:
reads and mounts work, publishing is skipped with one warning line, and a command that
only publishes fails with one error line naming the store (no traceback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from bootseer.cli.main import main
from bootseer.store.backends.local import LocalBackend
from bootseer.store.digest import sha256_digest
from bootseer.tree.build import TreeBuilder

pytestmark = pytest.mark.timeout(120)
DATA = os.urandom(200_000)


@pytest.fixture
def ro_store(tmp_path, need_root):
    """A store holding a tree (ref ``app``), seen through a read-only bind mount."""
    src = tmp_path / "store-rw"
    b = TreeBuilder(LocalBackend(src))
    b.add_file("/data.bin", DATA)
    LocalBackend(src).set_ref("app", b.finish())
    ro = tmp_path / "store-ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(src), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def _one_error_line(err: str, store) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("bootseer: error:") and str(store) in lines[0]
    assert "read-only" in lines[0]
    return lines[0]


def test_reads_work_and_put_fails_in_one_line(ro_store, tmp_path, capsys):
    assert not LocalBackend(ro_store).writable
    assert main(["store", "--store", str(ro_store), "ref", "get", "app"]) == 0
    tree = capsys.readouterr().out.strip()
    assert main(["store", "--store", str(ro_store), "stat", tree]) == 0
    new = tmp_path / "new"
    new.write_bytes(b"not in the store yet")
    capsys.readouterr()
    assert main(["store", "--store", str(ro_store), "put", str(new)]) == 1
    _one_error_line(capsys.readouterr().err, ro_store)


def test_ref_set_and_rm_fail_in_one_line(ro_store, capsys):
    tree = LocalBackend(ro_store).get_ref("app")
    assert main(["store", "--store", str(ro_store), "ref", "set", "other", tree]) == 1
    _one_error_line(capsys.readouterr().err, ro_store)
    assert main(["store", "--store", str(ro_store), "ref", "rm", "app"]) == 1
    _one_error_line(capsys.readouterr().err, ro_store)


def test_put_of_a_blob_it_already_holds_needs_no_write(ro_store, tmp_path, capsys):
    same = tmp_path / "same"
    same.write_bytes(b"published by the mirror's writer")
    LocalBackend(tmp_path / "store-rw").write(sha256_digest(same.read_bytes()),
                                              same.read_bytes())
    assert main(["store", "--store", str(ro_store), "put", str(same)]) == 0
    assert capsys.readouterr().out.strip() == sha256_digest(same.read_bytes())


def test_image_mount_record_mounts_and_warns_once(ro_store, tmp_path, need_fuse):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.Popen([sys.executable, "-m", "bootseer", "image", "mount", "app", str(mnt),
                          "--store", str(ro_store), "--record"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "mounted" in p.stdout.readline()
        assert (mnt / "data.bin").read_bytes() == DATA
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    warnings = [line for line in err.splitlines() if "read-only" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and str(ro_store) in warnings[0]
    assert "Traceback" not in err
    assert not os.path.ismount(mnt)
