"""docs/api.md is generated from the docstrings: the committed page must match them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_api_page_is_up_to_date():
    p = subprocess.run([sys.executable, str(REPO / "scripts/gen-api-doc.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_api_page_covers_the_public_modules():
    page = (REPO / "docs/api.md").read_text()
    for heading in ("## `bootseer`", "## `bootseer.trace`", "## `bootseer.ckpt`",
                    "## `bootseer.store`", "### `bootseer.ready() -> None`",
                    "### `bootseer.store.open_store("):
        assert heading in page
