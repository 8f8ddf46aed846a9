"""Issue 18 item 1: a path the user names as output is written in place, never renamed over
(bootseer/node/outputs.py): devices and FIFOs stay what they are, directories are refused."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from bootseer.cli.main import main
from bootseer.store.backends.local import LocalBackend
from bootseer.store.digest import sha256_digest

BLOB = b"checkpoint bytes " * 1000


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    LocalBackend(root).write(sha256_digest(BLOB), BLOB)
    return str(root)


def get(store, out) -> int:
    return main(["store", "--store", store, "get", sha256_digest(BLOB), "-o", str(out)])


def test_the_machines_dev_null_is_a_char_device():
    # read-only look: a run of this suite (as root) must never have replaced it
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_store_get_to_a_device_writes_to_it_and_keeps_it(store, tmp_path, need_root):
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))   # a scratch /dev/null
    assert get(store, null) == 0
    st = os.lstat(null)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert sorted(os.listdir(tmp_path)) == ["null", "store"]   # no temp left beside it


def test_store_get_to_a_fifo_streams_into_it(store, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    assert get(store, fifo) == 0
    reader.join(10)
    assert got == [BLOB]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_store_get_refuses_a_directory(store, tmp_path, capsys):
    target = tmp_path / "dir"
    target.mkdir()
    (target / "keep").write_text("mine")
    assert get(store, target) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bootseer: error: refusing to write output") and "directory" in err
    assert "\n" not in err
    assert (target / "keep").read_text() == "mine"


def test_store_get_rewrites_a_file_in_place(store, tmp_path):
    out = tmp_path / "out"
    out.write_bytes(b"old")
    os.chmod(out, 0o640)
    os.link(out, tmp_path / "other-name")
    inode = os.stat(out).st_ino
    assert get(store, out) == 0
    assert os.stat(out).st_ino == inode and stat.S_IMODE(os.stat(out).st_mode) == 0o640
    assert (tmp_path / "other-name").read_bytes() == BLOB   # the same file, rewritten


def test_store_get_writes_through_a_symlink(store, tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"old")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert get(store, link) == 0
    assert os.path.islink(link) and target.read_bytes() == BLOB


def test_a_corrupt_blob_leaves_the_output_untouched(store, tmp_path, capsys):
    blob = LocalBackend(store).path(sha256_digest(BLOB))
    os.chmod(blob, 0o644)
    blob.write_bytes(b"X" * len(BLOB))
    out = tmp_path / "out"
    out.write_bytes(b"old")
    assert get(store, out) == 1
    assert "corrupt" in capsys.readouterr().err
    assert out.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["out", "store"]


def test_report_refuses_a_directory_before_reading_the_trace(tmp_path, capsys):
    assert main(["report", str(tmp_path / "no-trace"), "--json", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "refusing to write output" in err and "no-trace" not in err


def test_run_summary_refuses_a_directory(tmp_path, capsys):
    assert main(["run", "--summary", str(tmp_path), "--", "true"]) == 1
    assert "refusing to write summary" in capsys.readouterr().err


def test_summary_is_written_in_place_to_a_device(tmp_path, need_root):
    from bootseer.node import outputs
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    outputs.write_text(null, "{}", "summary")
    assert stat.S_ISCHR(os.lstat(null).st_mode)
