"""The serving seam's own parts: the one chooser (each kind's fallback said once), the one
unmount (umount2: gone at once, detached when busy, no error when nothing is mounted), the
mount table read once (escaped names), and every mount error under errors.MountError."""

from __future__ import annotations

import logging
import os

import pytest

from bootseer.config import BootseerConfig, MountConfig
from bootseer.errors import MountError
from bootseer.mount import choose
from bootseer.mount.erofs import kernel
from bootseer.node import mounts

pytestmark = pytest.mark.timeout(60)


def _config(backend: str) -> BootseerConfig:
    return BootseerConfig(mount=MountConfig(backend=backend))


def test_environments_and_trees_fall_back_each_said_once(monkeypatch, caplog):
    monkeypatch.setattr(kernel, "availability", lambda: "no EROFS here (test)")
    monkeypatch.setattr(choose, "_said", set())
    with caplog.at_level(logging.WARNING, logger="bootseer.mount"):
        for _ in range(2):
            assert choose.choose(_config("auto"), choose.What.ENV) is None
            assert choose.choose(_config("auto"), choose.What.TREE) is choose.Serving.FUSE_VIEW
    lines = [r.getMessage() for r in caplog.records]
    assert sum("restored by extraction" in m for m in lines) == 1
    assert sum("lazy trees use the FUSE tree view" in m for m in lines) == 1
    with pytest.raises(kernel.ErofsMountError, match="restore environments by extraction"):
        choose.choose(_config("erofs"), choose.What.ENV)


def test_backend_fuse_serves_trees_by_fuse_and_restores_by_extraction(monkeypatch, caplog):
    monkeypatch.setattr(choose, "_said", set())
    with caplog.at_level(logging.WARNING, logger="bootseer.mount"):
        assert choose.choose(_config("fuse"), choose.What.TREE) is choose.Serving.FUSE_VIEW
        assert choose.choose(_config("fuse"), choose.What.ENV) is None
    assert "BOOTSEER_MOUNT_BACKEND=fuse" in caplog.text


def test_every_mount_error_is_a_mount_error():
    from bootseer.deps.mounts import KernelMountError
    from bootseer.mount import fuse
    from bootseer.mount.erofs.writer import ImageError
    from bootseer.mount.overlay import OverlayError
    assert fuse.MountError is MountError
    for cls in (kernel.ErofsMountError, ImageError, OverlayError, KernelMountError):
        assert issubclass(cls, MountError), cls


@pytest.fixture
def tmpfs(tmp_path, need_root):
    """A small tmpfs on a directory whose name the mount table escapes."""
    where = tmp_path / "a dir\twith space"
    where.mkdir()
    mounts.mount("bootseer-test", str(where), "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV,
                  "size=1m")
    yield where
    if mounts.is_mount_point(str(where)):
        mounts.unmount(str(where), detach=True)


def test_the_table_finds_an_escaped_mount_point_and_unmount_is_at_once(tmpfs):
    entry = mounts.find(str(tmpfs))
    assert entry is not None and entry.fstype == "tmpfs" and entry.mountpoint == str(tmpfs)
    assert mounts.is_mount_point(str(tmpfs))
    assert mounts.unmount(str(tmpfs)) is True
    assert not mounts.is_mount_point(str(tmpfs)) and mounts.find(str(tmpfs)) is None
    assert mounts.unmount(str(tmpfs)) is True   # nothing mounted: no error


def test_a_busy_mount_is_detached_and_its_open_file_still_reads(tmpfs):
    (tmpfs / "f").write_bytes(b"still here")
    with open(tmpfs / "f", "rb") as f:
        assert mounts.unmount(str(tmpfs)) is False   # busy: detached
        assert not mounts.is_mount_point(str(tmpfs))
        assert f.read() == b"still here"
    assert not os.path.exists(tmpfs / "f")


def test_a_failed_mount_says_why_with_its_errno(tmp_path, need_root):
    with pytest.raises(MountError) as e:
        mounts.mount("none", str(tmp_path / "absent"), "tmpfs", 0, "")
    assert e.value.errno == 2 and "absent" in str(e.value)
