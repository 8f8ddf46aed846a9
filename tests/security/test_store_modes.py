"""Issue 18 item 12: the local store layout is world-readable (blobs 0444, refs 0644,
folders 0755) whatever the writer's umask, so an ordinary nginx can serve it."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import urllib.request
from pathlib import Path

import pytest

from bootseer.store.backends.local import LocalBackend
from bootseer.store.digest import sha256_digest


@pytest.fixture
def public_dir():
    # pytest's tmp_path sits under 0700 folders that no ordinary user can cross
    d = Path(tempfile.mkdtemp(prefix="bootseer-store-modes-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


@pytest.fixture
def strict_umask():
    old = os.umask(0o077)
    yield
    os.umask(old)


def _write(root: Path) -> str:
    store = LocalBackend(root)
    d = sha256_digest(b"hello")
    store.write(d, b"hello")
    store.set_ref("team/model/latest", d)
    return d


def test_modes_do_not_follow_the_umask(tmp_path, strict_umask):
    root = tmp_path / "store"
    d = _write(root)
    modes = {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode)
             for p in [root, *root.rglob("*")]}
    assert modes["refs/team/model/latest"] == 0o644
    assert modes[f"blobs/sha256/{d[7:9]}/{d[7:]}"] == 0o444
    assert {m for p, m in modes.items() if (root / p).is_dir()} == {0o755}


def test_an_unprivileged_nginx_serves_refs_and_blobs(public_dir, strict_umask, nginx_factory,
                                                     need_root):
    d = _write(public_dir / "store")
    server = nginx_factory(public_dir / "store", worker_user="nobody nogroup")
    base = f"http://127.0.0.1:{server.port}"
    with urllib.request.urlopen(f"{base}/refs/team/model/latest", timeout=10) as r:
        assert r.read().decode().strip() == d
    with urllib.request.urlopen(f"{base}/blobs/sha256/{d[7:9]}/{d[7:]}", timeout=10) as r:
        assert r.read() == b"hello"
