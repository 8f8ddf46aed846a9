"""Checkpoint files through the job's peers (bootseer.ckpt.peers): real libtorrent
sessions on loopback (each node its own 127.0.0.x address, staging area and engine), the
checkpoint on a real nginx, the store a local directory (manifests, torrents, roster).
Every node goes through ``start_plan`` with its config, as the checkpoint mount does."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from bootseer.ckpt import peers as ckpt_peers
from bootseer.ckpt.engine import Engine
from bootseer.ckpt.listing import RemoteDir
from bootseer.ckpt.prefetch import start_plan
from bootseer.ckpt.staging import node_staging_dir
from bootseer.config import BootseerConfig
from bootseer.store import open_store
from bootseer.store.digest import sha256_digest

pytestmark = pytest.mark.timeout(120)
STRIPE = 1 << 20
FILES = {"model.safetensors": 3 * STRIPE + 12345, "optim/shard0.bin": 2 * STRIPE,
         ".metadata": 3000}   # a small file: never held back, never through peers


@pytest.fixture
def checkpoint(tmp_path, nginx_factory):
    www = tmp_path / "www"
    data = {}
    for rel, size in FILES.items():
        (www / rel).parent.mkdir(parents=True, exist_ok=True)
        data[rel] = os.urandom(size)
        (www / rel).write_bytes(data[rel])
    server = nginx_factory(www, limit_rate="256k")
    return server.url + "/", data


class Node:
    def __init__(self, tmp_path, url: str, n: int, *, job: str = "job-ckpt", attempt: int = 0,
                 nodes: int = 2, stall_s: float = 3.0, wait_s: float = 30.0):
        self.name, self.url = f"node{n}", url
        root = tmp_path / job / str(attempt) / self.name
        self.config = BootseerConfig.from_env({}, overrides={
            "store": {"url": str(tmp_path / "store")},
            "cache": {"dir": str(root / "cache")},
            "ckpt": {"stripe_bytes": STRIPE},
            "trace": {"job_id": job, "node": self.name, "attempt": attempt},
            "peers": {"mode": "on", "nodes": nodes, "interface": f"127.0.0.{n + 1}",
                      "port_min": 22000 + 10 * n, "port_max": 22009 + 10 * n,
                      "stall_s": stall_s, "wait_s": wait_s}})
        self.staging = node_staging_dir(self.config)
        self.engine = Engine(self.config.ckpt, self.config.fetch, staging=str(self.staging),
                             store_url=self.config.store.url)
        self.prefetch = None

    def run(self) -> Node:
        self.prefetch, _ = start_plan(self.engine, RemoteDir(self.url), config=self.config)
        return self

    def wait(self) -> dict:
        assert self.prefetch.join(90)
        return self.prefetch.peer_figures

    def staged(self) -> dict:
        """What this node staged, by relative path (complete files only)."""
        out = {}
        for rel, source in RemoteDir(self.url).walk().items():
            f = self.engine.file(source)
            if f.staged.complete:
                out[rel] = f.staged.pread(0, f.size)
        return out

    def origin_bytes(self) -> int:
        return self.engine.fetcher.counters()["bytes"]

    def close(self) -> None:
        self.engine.close()


@pytest.fixture
def nodes(tmp_path, checkpoint):
    made: list[Node] = []

    def make(n, **kw) -> Node:
        node = Node(tmp_path, checkpoint[0], n, **kw)
        made.append(node)
        return node

    yield make
    from bootseer.peers import _shares
    for node in made:
        node.close()
    for key in [k for k in _shares if k[0].startswith("job-ckpt")]:
        _shares.pop(key).close()


def _large_bytes() -> int:
    return sum(size for size in FILES.values() if size > (1 << 20))


def test_first_load_one_maker_the_others_from_it(nodes, checkpoint):
    _, data = checkpoint
    # a peer that stalls takes the rest from the origin (a feature): under a loaded
    # machine's pauses the figures would then count load, not the exchange
    a, b, c = (nodes(i, nodes=3, stall_s=20.0).run() for i in range(3))
    figures = [n.wait() for n in (a, b, c)]
    roles = sorted(f["peers_role"] for f in figures)
    assert roles == ["maker", "peer", "peer"], figures
    for n in (a, b, c):
        assert n.staged() == data                       # every byte right, every file
    origin = sum(n.origin_bytes() for n in (a, b, c))
    small = len(data[".metadata"]) * 3
    assert origin - small <= 1.2 * _large_bytes(), (origin, figures)
    assert sum(f["peer_bytes"] for f in figures) >= 2 * _large_bytes() * 0.8
    stats = [n.engine.statistics() for n in (a, b, c)]
    assert {s.peers_role for s in stats} == {"maker", "peer"}
    assert sum(s.peer_bytes for s in stats) == sum(f["peer_bytes"] for f in figures)


def test_known_manifest_every_node_joins_and_shares_the_origin(nodes, checkpoint):
    _, data = checkpoint
    first = nodes(0, nodes=1, attempt=0).run()   # a first start made the manifest
    assert first.wait()["peers_role"] == "maker"
    first.close()
    from bootseer.peers import _shares
    for key in [k for k in _shares if k[1] == "node0"]:
        _shares.pop(key).close()   # that node is gone: nobody seeds
    # as above: a long stall, so a node that starts late under load still takes its share
    a, b = (nodes(i, nodes=2, attempt=1, stall_s=20.0).run() for i in (1, 2))
    figures = [a.wait(), b.wait()]
    assert [f["peers_role"] for f in figures] == ["peer", "peer"], figures
    for n in (a, b):
        assert n.staged() == data
    origin = [f["origin_bytes"] for f in figures]
    assert sum(origin) <= 1.2 * _large_bytes(), figures
    assert all(o > 0 for o in origin), figures         # each took its share of the origin
    assert all(f["peer_bytes"] > 0 for f in figures), figures


def test_lying_peer_is_banned_and_its_stripes_refetched(nodes, checkpoint):
    _, data = checkpoint
    liar = nodes(0, nodes=2).run()
    assert liar.wait()["peers_role"] == "maker"
    seed = liar.config.cache.dir.rsplit("/", 1)[0] + "/peers"
    corrupted = 0
    for dirpath, _, names in os.walk(seed):
        for name in names:
            if name.endswith(".lock"):
                continue
            with open(os.path.join(dirpath, name), "r+b") as f:
                f.seek(100)
                f.write(b"\xff" * 64)
            corrupted += 1
    assert corrupted
    victim = nodes(1, nodes=2, stall_s=6.0).run()
    figures = victim.wait()
    assert victim.staged() == data                     # nothing corrupt was staged
    share = next(s for k, s in ckpt_peers_shares().items() if k[1] == "node1")
    assert "127.0.0.1" in share.swarm.banned, figures
    assert figures["origin_bytes"] > 0


def ckpt_peers_shares() -> dict:
    from bootseer.peers import _shares
    return {k: v for k, v in _shares.items() if k[0].endswith("-" + ckpt_peers.NAMESPACE)}


def test_no_manifest_and_no_maker_in_time_is_an_origin_load(nodes, checkpoint, tmp_path):
    """Another node holds the maker's ref but never publishes: after wait_s, the origin."""
    _, data = checkpoint
    node = nodes(1, nodes=2)
    node.config = node.config.replace(peers={"wait_s": 0.5})
    remote = RemoteDir(node.url)
    large = [s for s in remote.walk().values() if s.size > (1 << 20)]
    key = ckpt_peers.manifest_key(large, STRIPE)
    store = open_store(str(tmp_path / "store"))
    assert store.set_ref(f"peers/job-ckpt-ckpt/ckpt-maker/0/{key}", sha256_digest(b"x"),
                         exclusive=True)
    figures = node.run().wait()
    assert figures["peers_role"] == "origin"
    assert node.staged() == data


def test_a_manifest_of_other_files_is_ignored(nodes, checkpoint, tmp_path):
    _, data = checkpoint
    node = nodes(0, nodes=2)
    remote = RemoteDir(node.url)
    large = sorted((s for s in remote.walk().values() if s.size > (1 << 20)),
                   key=lambda s: s.key)
    key = ckpt_peers.manifest_key(large, STRIPE)
    store = open_store(str(tmp_path / "store"))
    bad = {"v": 1, "kind": ckpt_peers.KIND, "stripe_bytes": STRIPE,
           "files": [{"key": s.key, "size": s.size + 1, "stripes": []} for s in large]}
    blob = json.dumps(bad).encode()
    store.write(sha256_digest(blob), blob)
    store.set_ref(ckpt_peers.manifest_ref(key), sha256_digest(blob))
    files = [node.engine.file(s) for s in large]
    assert ckpt_peers.read_manifest(store, key, files) is None
    # the load goes on: this node becomes the maker and replaces nothing it cannot trust
    figures = node.run().wait()
    assert figures["peers_role"] == "maker"
    assert node.staged() == data


def test_peers_off_or_one_node_leave_the_plan_alone(nodes, checkpoint):
    node = nodes(0, nodes=1)
    node.config = node.config.replace(peers={"mode": "auto"})
    assert node.run().wait() == {}                      # auto, one node: no peers at all
    assert node.engine.statistics().peers_role is None
    stop = threading.Event()
    assert ckpt_peers.fetch_checkpoint(node.config, node.engine, [], None, stop) is None


def test_two_checkpoint_mounts_share_through_peers(need_fuse, nodes, checkpoint, tmp_path):
    """The user's path: each node's `ckpt mount` (its own FUSE server process) prefetches
    through the job's peers; the files read through the mounts are the checkpoint's, the
    origin served the large files about once, and each unmount's load report says where
    its bytes came from."""
    from bootseer.ckpt.mount import mount_checkpoint
    url, data = checkpoint
    pair = [nodes(i, job="job-ckpt-mount", nodes=2) for i in (3, 4)]
    for n in pair:
        n.engine.close()   # the mount's server process has its own engine
        # every node reads every file: stage them all (a first start's node share would
        # take only what each node read, from the origin; docs/ckpt.md)
        n.config = n.config.replace(ckpt={"stage": "all"})
    mounts, reports = [], []
    try:
        for n in pair:
            mp = tmp_path / f"mnt-{n.name}"
            mp.mkdir()
            reports.append(tmp_path / f"{n.name}.json")
            mounts.append((mp, mount_checkpoint(url, str(mp), n.config,
                                                stats_path=str(reports[-1]))))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                len(list(n.staging.glob("*.complete"))) == len(FILES) for n in pair):
            time.sleep(0.1)
        for mp, _ in mounts:
            for rel, body in data.items():
                assert (mp / rel).read_bytes() == body
    finally:
        for _, handle in mounts:
            handle.unmount()
    stats = [json.loads(r.read_text()) for r in reports]
    assert sorted(s["peers_role"] for s in stats) == ["maker", "peer"], stats
    assert sum(s["bytes_fetched"] for s in stats) <= 1.2 * _large_bytes() + 3 * 3000, [
        {k: s[k] for k in ("bytes_fetched", "peer_bytes", "peers_role", "elapsed_s")}
        for s in stats]
    assert sum(s["peer_bytes"] for s in stats) >= 0.8 * _large_bytes(), stats


def test_a_seed_copy_that_does_not_fit_leaves_the_load_to_the_origin(nodes, checkpoint,
                                                                      monkeypatch):
    """The seed copy holds the stripes a second time: without the room, no peers (the
    staging copy, which the job needs, is not put at risk)."""
    _, data = checkpoint
    monkeypatch.setattr(ckpt_peers, "SEED_HEADROOM_BYTES", 1 << 60)
    node = nodes(0, nodes=2).run()
    assert node.wait() == {}
    assert node.staged() == data


def test_a_maker_gone_mid_fetch_frees_the_others_long_before_wait_s(nodes, checkpoint,
                                                                    tmp_path):
    """The maker claimed the files and died: its peer port refuses, so the others stop
    waiting for its manifest within seconds (not wait_s) and load from the origin."""
    _, data = checkpoint
    # three nodes, one never came: the claim decides the maker; wait_s beyond the test's
    # timeout: a node that waited for it fails, however loaded the machine is
    node = nodes(1, nodes=3, wait_s=600.0)
    remote = RemoteDir(node.url)
    large = [s for s in remote.walk().values() if s.size > (1 << 20)]
    key = ckpt_peers.manifest_key(large, STRIPE)
    store = open_store(str(tmp_path / "store"))
    import socket as _socket
    with _socket.socket() as s:   # a port nobody listens on any more
        s.bind(("127.0.0.9", 0))
        dead = f"127.0.0.9:{s.getsockname()[1]}"
    blob = json.dumps({"node": "gone", "addr": dead}).encode()
    store.write(sha256_digest(blob), blob)
    assert store.set_ref(f"peers/job-ckpt-ckpt/ckpt-maker/0/{key}", sha256_digest(blob),
                         exclusive=True)
    figures = node.run().wait()
    assert figures["peers_role"] == "origin"
    assert node.staged() == data
