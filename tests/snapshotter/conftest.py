"""Nodes (a real containerd + the bootseer snapshotter, bootseer.testing.containerd) started
per test and stopped by PID."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bootseer.testing.containerd import Node, unmount_below
from tests.conftest import is_root, need


@pytest.fixture
def nodes(tmp_path):
    """``start(name, **kw)`` -> Node; every node stopped and removed at teardown."""
    need(is_root(), "containerd needs root")
    need(shutil.which("containerd") is not None and shutil.which("ctr") is not None,
         "containerd is not installed (apt-get install containerd)")
    top = Path(f"/tmp/bsc-{tmp_path.name[-8:]}")   # unix socket paths must stay short
    shutil.rmtree(top, ignore_errors=True)
    started: list[Node] = []

    def start(name: str, **kw) -> Node:
        node = Node(top / name, **kw)
        started.append(node)
        return node
    yield start
    try:
        for node in started:
            node.close()
    finally:
        unmount_below(top)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def containerd(nodes):
    return nodes("n").containerd
