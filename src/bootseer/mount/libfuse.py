"""Which libfuse mfusepy loads, found without a compiler. mfusepy asks ctypes for
``fuse`` (libfuse 2) first and ``fuse3`` only after it: on a node with libfuse 3 alone the
first question runs ``ldconfig``, then ``gcc`` and ``ld`` (ctypes' fallbacks), a few
tenths of a second in every FUSE server's start, before it can mount anything. Where the
linker cache lists no libfuse 2, mfusepy is told to ask for ``fuse3`` at once: the
library it would have ended with."""

from __future__ import annotations

import os
import subprocess

NAME = "FUSE_LIBRARY_NAME"


def settle() -> None:
    """Before mfusepy is imported (in a FUSE server's process): name ``fuse3`` for it where
    the linker cache has no libfuse 2. A choice the environment made is kept."""
    if os.environ.get("FUSE_LIBRARY_PATH") or os.environ.get(NAME):
        return
    try:
        listed = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True,
                                timeout=10, env={"LC_ALL": "C", "LANG": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return   # mfusepy searches as it always does
    names = {line.split()[0] for line in listed.splitlines()[1:] if line.strip()}
    if not any(n.startswith("libfuse.so") for n in names) and any(
            n.startswith("libfuse3.so") for n in names):
        os.environ[NAME] = "fuse3"
