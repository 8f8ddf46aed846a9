"""Each test builds its index's wheels anew (same names and versions, other bytes) and serves
them from a port an earlier test may have used: uv's shared cache would hand the resolver an
earlier test's wheel hashes (seen: "Expected sha256:... Computed sha256:..."). A real index
never changes a published file, so only the tests get a cache of their own."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_uv_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.mktemp("uv-cache")))
