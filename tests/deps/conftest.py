"""A test that fails halfway may leave an environment mounted under pytest's temporary
directories: unmount what is left there (deepest first) so neither the next test nor
pytest's clean-up of old temporary directories meets a mount, and fail the test."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _no_mount_left(tmp_path_factory):
    yield
    from bootseer.mount import points
    root = os.path.realpath(tmp_path_factory.getbasetemp())
    left = [e.mountpoint for e in points.table()
            if e.mountpoint == root or e.mountpoint.startswith(root + "/")]
    for mp in sorted(set(left), key=len, reverse=True):
        points.lazy_unmount(mp)
    assert not left, f"the test left mounts behind: {left}"
