"""Parts of cache files: renamed into place when complete, removed on failure, and swept
once their writer is gone, never while it runs."""

from __future__ import annotations

import fcntl
import os
import subprocess

import pytest

from bootseer.node.partfile import PartFile, sweep_dead, write_atomic


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_commit_renames_and_a_failure_leaves_nothing(tmp_path):
    dest = tmp_path / "x.blob"
    with PartFile(dest) as part:
        os.write(part.fd, b"whole")
        part.commit(mode=0o444)
    assert dest.read_bytes() == b"whole" and os.stat(dest).st_mode & 0o777 == 0o444
    with pytest.raises(RuntimeError), PartFile(tmp_path / "y.blob") as part:
        os.write(part.fd, b"half")
        raise RuntimeError("killed midway")
    assert sorted(os.listdir(tmp_path)) == ["x.blob"]
    write_atomic(tmp_path / "x.blob", b"new")
    assert sorted(os.listdir(tmp_path)) == ["x.blob"] and dest.read_bytes() == b"new"


def test_only_parts_whose_writer_is_gone_are_swept(tmp_path):
    live = PartFile(tmp_path / "live.blob")   # this process writes it: locked
    dead = tmp_path / f"dead.blob.part-{_dead_pid()}-0a0b0c0d"
    # a writer that made its part and has not locked it yet: its pid still runs
    starting = tmp_path / f"starting.blob.part-{os.getpid()}-01020304"
    # a writer whose pid this PID namespace does not show: its lock alone keeps the part
    elsewhere = tmp_path / f"elsewhere.blob.part-{_dead_pid()}-05060708"
    for part in (dead, starting, elsewhere):
        part.write_bytes(b"x" * 4096)
    (tmp_path / "other.blob").write_bytes(b"not a part")
    held = os.open(elsewhere, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert sweep_dead(tmp_path) == [str(dead)]
        assert sorted(os.listdir(tmp_path)) == sorted([
            "other.blob", os.path.basename(live.path), starting.name, elsewhere.name])
    finally:
        os.close(held)
        live.close()
    assert sweep_dead(tmp_path) == [str(elsewhere)]
