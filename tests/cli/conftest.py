"""Running the real ``bootseer`` command, as a user does, in a scratch world."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

DIGEST_OF_HI = "sha256:98ea6e4f216f2fb4b69fff9b3a44842c38686ca685f3f55dc48c5d3fb1107be4"
"""The blob ``hi\\n``, put in every world's store."""


@dataclass
class World:
    root: Path
    store: Path
    env: dict

    def run(self, *argv: str, env: dict | None = None, prefix: list[str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [*(prefix or []), sys.executable, "-m", "bootseer", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=self.root,
                              env={**self.env, **(env or {})}, timeout=timeout)


@pytest.fixture
def world(tmp_path) -> World:
    """A store holding one blob; no trace location, no stray ``BOOTSEER_*`` settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("BOOTSEER_") or k.startswith("BOOTSEER_TEST_")}
    store = tmp_path / "store"
    w = World(tmp_path, store, {**env, "BOOTSEER_STORE_URL": str(store),
                                "BOOTSEER_CACHE_DIR": str(tmp_path / "cache")})
    (tmp_path / "hi").write_text("hi\n")
    r = w.run("store", "put", "hi")
    assert r.stdout.strip() == DIGEST_OF_HI, r.stderr
    return w


def error_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("bootseer: error:")]
