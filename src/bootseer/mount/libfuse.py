"""Which libfuse mfusepy loads, found without a compiler. mfusepy asks ctypes for
``fuse`` (libfuse 2) first and ``fuse3`` only after it: on a node with libfuse 3 alone the
first question runs ``ldconfig``, then ``gcc`` and ``ld`` (ctypes' fallbacks), and the
second ``ldconfig`` again, tenths of a second in every FUSE server's start, before it can
mount anything. Where no libfuse 2 is installed, mfusepy is given ``libfuse3.so.3`` at once:
the library it would have ended with. The usual library directories are looked at first
(a few ``stat`` calls); the linker cache only when they hold neither."""

from __future__ import annotations

import os
import subprocess
import sys

NAME = "FUSE_LIBRARY_NAME"
PATH = "FUSE_LIBRARY_PATH"
SONAME3 = "libfuse3.so.3"


def settle() -> None:
    """Before mfusepy is imported (in a FUSE server's process): name libfuse 3 for it where
    no libfuse 2 is installed. A choice the environment made is kept."""
    if os.environ.get(PATH) or os.environ.get(NAME):
        return
    found = _in_library_dirs() or _in_linker_cache()
    if found == "fuse3":
        os.environ[PATH] = SONAME3


def _library_dirs() -> list[str]:
    arch = getattr(sys.implementation, "_multiarch", "")
    dirs = [f"/lib/{arch}", f"/usr/lib/{arch}"] if arch else []
    return [*dirs, "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib"]


def _in_library_dirs() -> str | None:
    """``fuse2`` if a libfuse 2 is in a usual directory, else ``fuse3`` if a libfuse 3 is,
    else None."""
    fuse3 = False
    for d in _library_dirs():
        try:
            names = os.listdir(d)
        except OSError:
            continue
        if any(n.startswith("libfuse.so.2") for n in names):
            return "fuse2"
        fuse3 = fuse3 or SONAME3 in names
    return "fuse3" if fuse3 else None


def _in_linker_cache() -> str | None:
    try:
        listed = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True,
                                timeout=10, env={"LC_ALL": "C", "LANG": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return None   # mfusepy searches as it always does
    names = {line.split()[0] for line in listed.splitlines()[1:] if line.strip()}
    if any(n.startswith("libfuse.so") for n in names):
        return "fuse2"
    return "fuse3" if SONAME3 in names else None
