"""Fixtures: one store of every backend kind, each against its real server (a directory,
nginx, docker-registry) or at the fsspec boundary (memory://, a fake hdfs://)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from bootseer.store import open_store
from tests.store_backends.fakes import register_fake_hdfs

# http and oci need their server (the fixture asks for it only then): marked, so the
# others stay in the fast tier.
KINDS = ["local", pytest.param("http", marks=pytest.mark.servers),
         pytest.param("oci", marks=pytest.mark.servers), "memory", "hdfs"]


@dataclass
class Store:
    kind: str
    writer: Any
    """Backend that writes (for http: the directory nginx serves)."""
    reader: Any
    """Backend under test for reads (for http: the HTTP backend)."""
    server: Any = None


@pytest.fixture(params=KINDS)
def store(request, tmp_path):
    kind = request.param
    if kind == "local":
        b = open_store(str(tmp_path / "store"))
        yield Store(kind, b, b)
    elif kind == "http":
        w = open_store(str(tmp_path / "store"))
        server = request.getfixturevalue("nginx_factory")(tmp_path / "store")
        yield Store(kind, w, open_store(server.url), server)
    elif kind == "oci":
        # the session's registry, a repository of this test's own
        server = request.getfixturevalue("shared_registry")
        repo = re.sub(r"[^a-z0-9]+", "-", tmp_path.name.lower()).strip("-")
        b = open_store(f"oci://{server.host}:{server.port}/conformance/{repo}")
        yield Store(kind, b, b, server)
    elif kind == "memory":
        b = open_store(f"memory://conf-{tmp_path.name}")
        yield Store(kind, b, b)
        if b.fs.exists(b.root):
            b.fs.rm(b.root, recursive=True)
    else:
        fake = register_fake_hdfs()
        b = open_store(f"hdfs://namenode:8020/user/bootseer/conf-{tmp_path.name}")
        yield Store(kind, b, b)
        fake.store.clear()
