"""`bootseer run`'s command check resolves the command inside the image root as the
container will (issue 18, item 17a): ``..`` never climbs out of the root and symlinks,
absolute or relative, stay in it; the host's files never make a command "found"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.run import inroot
from tests.security import test_sigkill

# test_sigkill's converted busybox image, as this module's fixture too (pytest finds a
# fixture among a module's attributes; an import the function then names as an argument
# reads to pyflakes as a redefinition)
image_store = test_sigkill.image_store

HOST_ONLY = "/usr/bin/env"   # on the host, not in the test roots


@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "root"
    (r / "bin").mkdir(parents=True)
    (r / "usr/lib").mkdir(parents=True)
    (r / "bin/tool").write_text("#!/bin/sh\n")
    os.symlink("/bin", r / "usr/bin")                  # absolute: the root's /bin
    os.symlink("../../bin/tool", r / "usr/lib/rel")    # relative, inside
    os.symlink("../../../../../../../../usr/bin/env", r / "bin/climb")   # clamps at the root
    os.symlink("/../../../../usr/bin/env", r / "bin/abs-climb")
    os.symlink("loop", r / "bin/loop")
    return r


def test_dotdot_never_leaves_the_root(root):
    assert os.path.exists(HOST_ONLY)
    assert not inroot.has_command(root, "../../../../../../../../usr/bin/env")
    assert not inroot.has_command(root, "/../../../../../../usr/bin/env")
    assert not inroot.has_command(root, "env", path="/../../../../../../../../usr/bin")
    assert not inroot.has_command(root, "../../usr/bin/env", workdir="/bin")
    assert inroot.has_command(root, "../../../bin/tool", workdir="/usr/lib")   # clamped: /bin


def test_symlinks_resolve_inside_the_root(root):
    assert inroot.resolve(root, "/usr/bin/tool") == root / "bin/tool"
    assert inroot.resolve(root, "/usr/lib/rel") == root / "bin/tool"
    assert inroot.has_command(root, "tool", path="/usr/bin")
    assert inroot.resolve(root, "/bin/climb") is None          # -> <root>/usr/bin/env: absent
    assert inroot.resolve(root, "/bin/abs-climb") is None
    assert not inroot.has_command(root, "/bin/climb")
    assert inroot.resolve(root, "/bin/loop") is None           # ELOOP, not a hang
    assert inroot.resolve(root, "/bin/tool/x") is None         # a file is not a directory
    assert not inroot.has_command(root, "/bin")                # a directory is no command
    # the link target appears inside the root: then it is found, there
    os.unlink(root / "usr/bin")
    (root / "usr/bin").mkdir()
    (root / "usr/bin/env").write_text("")
    assert inroot.resolve(root, "/bin/climb") == root / "usr/bin/env"


def test_bootseer_run_refuses_a_command_outside_the_image(need_root, need_fuse, image_store,
                                                          tmp_path):
    """Through the real command: the image has no /usr/bin/env; `../..` must not find the
    host's. One error line, exit status 127, before any container starts."""
    if not shutil.which("podman") and not shutil.which("unshare"):
        pytest.skip("no container runtime")
    store, tree = image_store
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache/blobs")}
    r = subprocess.run([sys.executable, "-m", "bootseer", "image", "run", tree, "--store",
                        store, "--", "../../../../../../../../usr/bin/env"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 127, r.stderr
    assert "not found in image" in r.stderr and "Traceback" not in r.stderr
