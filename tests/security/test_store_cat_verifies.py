"""``store cat`` and ``store get -o -`` write no byte of a corrupt blob: the blob is
verified before the first byte leaves, as ``get -o FILE`` does."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

DATA = os.urandom(3 << 20)


def _store_with_corrupt_blob(tmp_path):
    digest = "sha256:" + hashlib.sha256(DATA).hexdigest()
    hexd = digest.split(":")[1]
    blob = tmp_path / "store/blobs/sha256" / hexd[:2] / hexd
    blob.parent.mkdir(parents=True)
    bad = bytearray(DATA)
    bad[-1] ^= 0xFF   # the damage is in the last part: the first parts would be out already
    blob.write_bytes(bytes(bad))
    return digest


@pytest.mark.parametrize("argv", [["cat"], ["get", "-o", "-"]])
def test_a_corrupt_blob_writes_nothing_to_stdout(tmp_path, argv):
    digest = _store_with_corrupt_blob(tmp_path)
    r = subprocess.run([sys.executable, "-m", "bootseer", "store", argv[0], digest, *argv[1:],
                        "--store", str(tmp_path / "store")], capture_output=True, timeout=60)
    assert r.returncode == 1
    assert r.stdout == b""
    assert b"corrupt" in r.stderr and len(r.stderr.decode().strip().splitlines()) <= 2


def test_a_good_blob_is_written_whole(tmp_path):
    digest = "sha256:" + hashlib.sha256(DATA).hexdigest()
    r = subprocess.run([sys.executable, "-m", "bootseer", "store", "put", "-",
                        "--store", str(tmp_path / "store")], input=DATA, capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "bootseer", "store", "cat", digest,
                        "--store", str(tmp_path / "store")], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == DATA
