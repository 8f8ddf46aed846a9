"""A FUSE server names mfusepy its libfuse (``bootseer.mount.libfuse``) without the
compiler probe: the library mfusepy loads is the one it finds by its own search, and a
choice the environment made is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fuse

LOADED = "import mfusepy; print(mfusepy._libfuse_path)"


def _run(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FUSE_LIBRARY")}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                          capture_output=True, text=True, check=True).stdout.strip()


def test_settled_library_is_the_one_mfusepy_finds_itself():
    settled = _run("from bootseer.mount import libfuse; libfuse.settle(); " + LOADED)
    assert settled and settled == _run(LOADED)
    # and neither ldconfig nor a compiler ran to find it
    assert _run("import subprocess; from bootseer.mount import libfuse\n"
                "def no(*a, **k): raise AssertionError(a)\n"
                "subprocess.run = subprocess.Popen = no\n"
                "libfuse.settle(); " + LOADED) == settled


def test_a_library_the_environment_names_is_kept():
    got = _run("import os; from bootseer.mount import libfuse; libfuse.settle(); "
               "print(os.environ.get('FUSE_LIBRARY_NAME'))", FUSE_LIBRARY_PATH="/x/libfuse.so")
    assert got == "None"
    got = _run("import os; from bootseer.mount import libfuse; libfuse.settle(); "
               "print(os.environ.get('FUSE_LIBRARY_NAME'), os.environ.get('FUSE_LIBRARY_PATH'))",
               FUSE_LIBRARY_NAME="fuse")
    assert got == "fuse None"


def test_libfuse_2_where_installed_is_left_to_mfusepy(tmp_path, monkeypatch):
    from bootseer.mount import libfuse
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "libfuse3.so.3").touch()
    monkeypatch.setattr(libfuse, "_library_dirs", lambda: [str(tmp_path / "a"),
                                                           str(tmp_path / "missing")])
    assert libfuse._in_library_dirs() == "fuse3"
    (tmp_path / "b" / "libfuse.so.2.9.9").touch()
    monkeypatch.setattr(libfuse, "_library_dirs", lambda: [str(tmp_path / "a"),
                                                           str(tmp_path / "b")])
    assert libfuse._in_library_dirs() == "fuse2"
    monkeypatch.setattr(libfuse, "_library_dirs", lambda: [str(tmp_path / "missing")])
    assert libfuse._in_library_dirs() is None
