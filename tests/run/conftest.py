"""A tiny real container root: busybox-static plus its applet links, built per session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

BUSYBOX = shutil.which("busybox") or "/bin/busybox"


def make_busybox_rootfs(root: Path) -> Path:
    for d in ("bin", "proc", "dev", "tmp", "etc", "sys"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    for applet in ("sh", "cat", "echo", "sleep", "ls", "touch", "test", "true", "false",
                   "kill", "ps", "env", "mkdir", "trap", "wc", "id"):
        link = root / "bin" / applet
        if not link.exists():
            os.symlink("busybox", link)
    os.chmod(root / "tmp", 0o1777)
    return root


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory):
    if not os.path.exists(BUSYBOX):
        pytest.skip("busybox-static is not installed")
    return make_busybox_rootfs(tmp_path_factory.mktemp("rootfs"))
