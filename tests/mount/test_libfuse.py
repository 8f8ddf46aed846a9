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


def test_a_library_the_environment_names_is_kept():
    got = _run("import os; from bootseer.mount import libfuse; libfuse.settle(); "
               "print(os.environ.get('FUSE_LIBRARY_NAME'))", FUSE_LIBRARY_PATH="/x/libfuse.so")
    assert got == "None"
    got = _run("import os; from bootseer.mount import libfuse; libfuse.settle(); "
               "print(os.environ.get('FUSE_LIBRARY_NAME'))", FUSE_LIBRARY_NAME="fuse")
    assert got == "fuse"
