"""Build an environment for a prefix: a venv, the locked pins installed with uv (pip as
fallback), bytecode compiled in unchecked-hash mode so the .pyc files stay valid after a
restore changes mtimes.

The build runs in a temporary sibling of the prefix (``root``), never at the prefix: a
killed build must leave nothing half-made where jobs look. A venv names its own path
(script shebangs, ``activate*``), so once installed those occurrences are rewritten to the
prefix as a relocation does, and bytecode records the prefix's paths; the caller renames
the result into place. The builder's children (uv, pip) die with this process.
"""

from __future__ import annotations

import os
import shutil

from bootseer.deps import relocate
from bootseer.deps.prefix import Sibling
from bootseer.deps.resolve import DepsError, _run, uv


def build(locked: str, prefix: str, python: str, index_urls: list[str] | None = None, *,
          root: str | None = None) -> None:
    """Build the environment that will live at ``prefix`` in the directory ``root`` (by
    default the prefix itself), which must not exist yet."""
    root = root or prefix
    idx = []
    for i, u in enumerate(index_urls or []):
        idx += ["--index-url" if i == 0 else "--extra-index-url", u]
    # scratch beside the prefix: uv links from its cache on the same filesystem, and a
    # killed build's cache is swept with its other leftovers
    with Sibling(prefix, "scratch") as scratch:
        os.makedirs(scratch.path)
        req = os.path.join(scratch.path, "locked.txt")
        with open(req, "w") as f:
            f.write(locked)
        env = {**os.environ, "UV_NO_CONFIG": "1",
               "UV_CACHE_DIR": os.path.join(scratch.path, "uv-cache")}
        try:
            _run([*uv(), "venv", "-q", "--python", python, root], "uv venv", env=env)
            _run([*uv(), "pip", "install", "-q", "--python", f"{root}/bin/python",
                  "--require-hashes", *idx, "-r", req], "uv pip install", env=env)
        except (DepsError, OSError) as e:
            if shutil.which("uv") is not None and not isinstance(e, OSError):
                raise
            shutil.rmtree(root, ignore_errors=True)  # uv missing: pip
            _run([python, "-m", "venv", root], "python -m venv")
            _run([f"{root}/bin/python", "-m", "pip", "install", "-q", "--no-cache-dir",
                  "--require-hashes", *idx, "-r", req], "pip install")
    compile_args: list[str] = []
    if root != prefix:
        found = relocate.scan(root, root)
        if found["binary"]:
            raise DepsError(f"the build wrote its own directory into binary files "
                            f"({', '.join(found['binary'][:3])}), which cannot be moved to "
                            f"{prefix}")
        relocate.rewrite(root, found, root, prefix)
        compile_args = ["-s", root, "-p", prefix]      # bytecode names the prefix's files
    _run([f"{root}/bin/python", "-m", "compileall", "-q", "-j", "0", *compile_args,
          "--invalidation-mode", "unchecked-hash", root], "compileall")
