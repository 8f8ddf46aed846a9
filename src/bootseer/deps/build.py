"""Build an environment at its final prefix (so nothing needs relocating): a venv, the
locked pins installed with uv (pip as fallback), bytecode compiled in unchecked-hash mode
so the .pyc files stay valid after a restore changes mtimes."""

from __future__ import annotations

import os
import shutil
import tempfile

from bootseer.deps.resolve import DepsError, _run, uv


def build(locked: str, prefix: str, python: str, index_urls: list[str] | None = None) -> None:
    if os.path.exists(prefix):
        shutil.rmtree(prefix)
    idx = []
    for i, u in enumerate(index_urls or []):
        idx += ["--index-url" if i == 0 else "--extra-index-url", u]
    with tempfile.TemporaryDirectory(prefix="bsdeps-") as tmp:
        req = os.path.join(tmp, "locked.txt")
        with open(req, "w") as f:
            f.write(locked)
        env = {**os.environ, "UV_NO_CONFIG": "1", "UV_CACHE_DIR": os.path.join(tmp, "uv-cache")}
        try:
            _run([*uv(), "venv", "-q", "--python", python, prefix], "uv venv", env=env)
            _run([*uv(), "pip", "install", "-q", "--python", f"{prefix}/bin/python",
                  "--require-hashes", *idx, "-r", req], "uv pip install", env=env)
        except (DepsError, OSError) as e:
            if shutil.which("uv") is not None and not isinstance(e, OSError):
                raise
            shutil.rmtree(prefix, ignore_errors=True)  # uv missing: pip
            _run([python, "-m", "venv", prefix], "python -m venv")
            _run([f"{prefix}/bin/python", "-m", "pip", "install", "-q", "--no-cache-dir",
                  "--require-hashes", *idx, "-r", req], "pip install")
    _run([f"{prefix}/bin/python", "-m", "compileall", "-q", "-j", "0",
          "--invalidation-mode", "unchecked-hash", prefix], "compileall")
