"""Local directory backend: atomic, verified writes and cross-process exclusive refs."""

from __future__ import annotations

import io
import multiprocessing
import os

import pytest

from bootseer.errors import DigestMismatch, StoreError
from bootseer.store import sha256_digest
from bootseer.store.backends.local import LocalBackend

pytestmark = pytest.mark.timeout(60)


def _race(root, i, barrier, results):
    b = LocalBackend(root)
    d = sha256_digest(str(i).encode())
    barrier.wait()
    results.put((i, b.set_ref("leases/build", d, exclusive=True)))


@pytest.mark.slow
def test_exclusive_ref_is_atomic_across_processes(tmp_path):
    b = LocalBackend(tmp_path / "s")
    for i in range(6):
        b.write(sha256_digest(str(i).encode()), str(i).encode())
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(tmp_path / "s", i, barrier, results))
             for i in range(6)]
    try:
        [p.start() for p in procs]
        got = [results.get(timeout=30) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    winners = [i for i, won in got if won]
    assert len(winners) == 1
    assert b.get_ref("leases/build") == sha256_digest(str(winners[0]).encode())
    assert not list((tmp_path / "s/refs/leases").glob(".tmp-*"))


def test_mismatch_leaves_nothing(tmp_path):
    b = LocalBackend(tmp_path / "s")
    wrong = "sha256:" + "3" * 64
    with pytest.raises(DigestMismatch):
        b.write(wrong, io.BytesIO(os.urandom(3_000_000)))
    data = b"abc"
    with pytest.raises(DigestMismatch, match="expected 4 bytes"):
        b.write(sha256_digest(data), io.BytesIO(data), size=4)
    assert not [p for p in (tmp_path / "s").rglob("*") if p.is_file()]


def test_blobs_are_read_only_files(tmp_path):
    b = LocalBackend(tmp_path / "s")
    d = sha256_digest(b"x")
    b.write(d, b"x")
    assert b.path(d).stat().st_mode & 0o777 == 0o444


def test_corrupt_ref_file_is_a_clear_error(tmp_path):
    b = LocalBackend(tmp_path / "s")
    (tmp_path / "s/refs/broken").write_text("garbage\n")
    with pytest.raises(StoreError, match="ref broken .* is corrupt"):
        b.get_ref("broken")


def test_unwritable_root_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a dir")
    with pytest.raises(StoreError, match="cannot create store"):
        LocalBackend(tmp_path / "file" / "store")
