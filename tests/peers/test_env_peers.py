"""Environment snapshots through the job's peers: the second node of a job restores the
packs of a snapshot from the first (each chunk verified as from the store), and the
restored environment is the same."""

from __future__ import annotations

import os

import pytest

from bootseer.config import BootseerConfig
from bootseer.deps import restore, snapshot
from bootseer.peers import _shares
from bootseer.store import open_store
from bootseer.tree import peers as tree_peers

pytestmark = pytest.mark.timeout(120)
JOB = "job-env"


def node_config(tmp_path, store, n: int, **peers) -> BootseerConfig:
    return BootseerConfig.from_dict({
        "store": {"url": store.url}, "cache": {"dir": str(tmp_path / f"n{n}" / "cache")},
        "trace": {"job_id": JOB, "node": f"env{n}"},
        "peers": {"mode": "auto", "nodes": 2, "min_set_bytes": 0, "stall_s": 3.0,
                  "interface": f"127.0.0.{50 + n}", "port_min": 21800, "port_max": 21899,
                  **peers}})


def tree_files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".bootseer")}


def test_second_node_restores_the_snapshot_from_the_first(tmp_path, monkeypatch):
    env = tmp_path / "built"
    (env / "lib").mkdir(parents=True)
    for i in range(6):
        (env / "lib" / f"mod{i}.so").write_bytes(os.urandom(512 * 1024 + i))
    store = open_store(str(tmp_path / "store"))
    snapshot.publish(store, str(env), "sha256:" + "e" * 64, root=str(env))
    manifest = snapshot.load_manifest(store, store.get_ref(snapshot.env_ref("sha256:" + "e" * 64)))
    figures = []
    real = tree_peers.fetch_tree

    def recorded(config, store, reader):
        figures.append(real(config, store, reader))
        return figures[-1]
    monkeypatch.setattr(tree_peers, "fetch_tree", recorded)
    try:
        for n in (1, 2):
            prefix = tmp_path / f"n{n}" / "env"
            prefix.parent.mkdir(parents=True, exist_ok=True)
            restore.extract(store, manifest, str(prefix), node_config(tmp_path, store, n),
                            manifest["key"])
            assert tree_files(prefix) == tree_files(env)
        assert figures[0]["peers_role"] == "maker" and figures[0]["peer_bytes"] == 0
        assert figures[1]["peers_role"] == "peer", figures[1]
        assert figures[1]["peer_bytes"] >= 3 << 20 and figures[1]["origin_bytes"] == 0
    finally:
        for key in [k for k in _shares if k[0].startswith(JOB)]:
            _shares.pop(key).close()


def test_peers_apply_to_an_environment_only_when_worth_it(tmp_path):
    store = open_store(str(tmp_path / "store"))
    mib = 1 << 20
    assert tree_peers.env_wanted(node_config(tmp_path, store, 1), mib, 3 * mib)
    assert not tree_peers.env_wanted(node_config(tmp_path, store, 1, nodes=1), mib, 3 * mib)
    assert not tree_peers.env_wanted(node_config(tmp_path, store, 1, mode="off"), mib, 3 * mib)
    # the threshold counts the bytes on the wire (compressed), not the extracted size
    small = node_config(tmp_path, store, 1, min_set_bytes=2 * mib)
    assert not tree_peers.env_wanted(small, mib, 3 * mib)
    assert tree_peers.env_wanted(node_config(tmp_path, store, 1, mode="on", min_set_bytes=2 * mib),
                             mib, 3 * mib)
    tight = node_config(tmp_path, store, 1).replace(cache={"budget_bytes": 4 * mib})
    assert not tree_peers.env_wanted(tight, mib, 3 * mib)   # would not stay in the node cache
