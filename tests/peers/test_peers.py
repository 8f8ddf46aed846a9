"""Peer-to-peer hot sets with real libtorrent sessions on loopback: each "node" has its own
127.0.0.x address, swarm, fetcher and node cache; the store (a local directory) is the
origin and the roster, its pack reads paced through one shared link (``SharedLink``: an
origin as fast as a local disk would finish before any peer connects)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from bootseer.config import BootseerConfig, CacheConfig, FetchConfig, PeersConfig
from bootseer.peers import share_for
from bootseer.peers.share import PeerShare
from bootseer.peers.swarm import Swarm
from bootseer.peers.torrent import (
    layout,
    load_torrent,
    make_torrent,
    put_member,
    set_key,
    torrent_name,
)
from bootseer.store import open_store
from bootseer.store.cache import NodeCache
from bootseer.store.digest import sha256_digest
from bootseer.store.fetch import Fetcher
from bootseer.tree.build import TreeBuilder, add_directory
from bootseer.tree.peer_source import TreeChunks, set_items
from bootseer.tree.prefetch import Prefetcher
from bootseer.tree.reader import TreeReader
from bootseer.tree.toc import ChunkRef

pytestmark = pytest.mark.timeout(120)
JOB = "job-p2p"
ORIGIN_RATE = 2 << 20   # bytes per second through the origin's one link, all nodes together (the
                        # set takes 2 s: peers connect within a second or so)


class SharedLink:
    """The store as an origin behind one link: pack reads (not refs or small blobs) are
    paced at ``rate`` for all nodes together; ``sent`` counts them (origin egress)."""

    def __init__(self, inner, rate: int = ORIGIN_RATE):
        self.inner, self.rate, self.sent = inner, rate, 0
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def read(self, digest, start=0, end=None):
        data = self.inner.read(digest, start, end)
        if len(data) >= 64 * 1024:
            with self._lock:
                time.sleep(len(data) / self.rate)
                self.sent += len(data)
        return data


LARGE = [256 * 1024 + i for i in range(16)]   # one chunk each, a torrent file each
# an environment's shape: small modules (packed into bundles) between large files
MIXED = [256 * 1024 + i if i % 50 == 0 else 1000 + 37 * i for i in range(300)]


@pytest.fixture
def tree(tmp_path, request):
    """A tree of incompressible files (the stored set is as large as the files; sizes from
    the test's parameter, else LARGE) and a profile naming every chunk: the hot set."""
    root = tmp_path / "src"
    root.mkdir()
    for i, size in enumerate(getattr(request, "param", LARGE)):
        (root / f"f{i:03d}").write_bytes(os.urandom(size))
    store = open_store(str(tmp_path / "store"))
    b = TreeBuilder(store, chunk_size=1 << 20, pack_size=2 << 20)
    add_directory(b, root)
    digest = b.finish()
    r = TreeReader(store, digest, Fetcher(FetchConfig(max_inflight=4)))
    profile = {"chunks": [[c.digest] for c in r.all_chunks()]}
    set_bytes = sum(c.stored for c in r.all_chunks())
    return SharedLink(store), digest, profile, set_bytes


def publish(tree, tmp_path) -> None:
    """The set's torrent, as the recording node publishes it with the profile."""
    from bootseer.tree.peers import publish_torrent
    store, digest, _, _ = tree
    r = TreeReader(store.inner, digest, Fetcher(FetchConfig()))
    assert publish_torrent(store, r.all_chunks(), lambda ref: None, r.chunk,
                           str(tmp_path / "publish"))


class Node:
    def __init__(self, tmp_path, store, tree_digest, profile, n, *, stall_s=3.0, wait_s=30.0,
                 upload_cap=0, job=JOB, cache_budget=1 << 30, attempt=0, nodes=0,
                 peers=True):
        self.name = f"node{n}"
        tmp_path = tmp_path / job
        self.cache = NodeCache(CacheConfig(dir=str(tmp_path / self.name / "cache"),
                                           budget_bytes=cache_budget))
        self.reader = TreeReader(store, tree_digest, Fetcher(FetchConfig(max_inflight=8)),
                                 self.cache)
        self.share = None
        if peers:
            swarm = Swarm(f"127.0.0.{n + 1}", port_min=21000 + 10 * n,
                          port_max=21009 + 10 * n, upload_cap=upload_cap)
            settings = PeersConfig(mode="on", stall_s=stall_s, wait_s=wait_s, nodes=nodes)
            self.share = PeerShare(store, swarm, job, self.name,
                                   str(tmp_path / self.name / "peers"), settings,
                                   refresh_s=0.05, attempt=attempt)
        self.prefetcher = Prefetcher(self.reader, profile, peers=self.share)

    def run(self) -> Node:
        self.prefetcher.start()
        return self

    def wait(self) -> dict:
        self.prefetcher.wait(90)
        return self.prefetcher.stats

    def has_all(self) -> bool:
        """Every chunk is in this node's cache, and right (the cache re-verifies)."""
        return all(self.cache.get(c.digest, c.size) is not None for c in self.reader.all_chunks())

    def close(self) -> None:
        if self.share is not None:
            self.share.close()


@pytest.fixture
def nodes(tmp_path, tree):
    made: list[Node] = []

    def make(n, **kw) -> Node:
        store, digest, profile, _ = tree
        node = Node(tmp_path, store, digest, profile, n, **kw)
        made.append(node)
        return node

    yield make
    for node in made:
        node.close()


def write_seed_copy(where, items, data_of) -> None:
    """The files of the torrent of ``items`` under ``where``, as a seeding node holds them
    (``data_of[digest]``: the item's bytes)."""
    files = where / torrent_name(set_key(items))
    files.mkdir(parents=True)
    for tfile in layout(items):
        for m in tfile.members:
            put_member(files, tfile, m, data_of[m.digest])


def run_all(group: list) -> list[dict]:
    """Start every node of ``group`` at once; their prefetch figures, each node's cache
    holding the whole set (verified)."""
    for node in group:
        node.run()
    stats = [node.wait() for node in group]
    assert all(node.has_all() for node in group)
    return stats


def test_torrent_is_the_same_on_every_node_and_checked(tmp_path):
    data_of, refs = {}, []
    for i, size in enumerate((40000, 200, 3000, 70000, 9000)):
        data = os.urandom(size)
        data_of[sha256_digest(data)] = data
        refs.append(ChunkRef(sha256_digest(data), 0, i * 100000, size, size))
    items = set_items(refs)
    assert set_items(refs[::-1]) == items   # pack order, whatever the refs' order
    out = []
    for where in ("a", "b"):
        write_seed_copy(tmp_path / where, items, data_of)
        out.append(make_torrent(str(tmp_path / where), items))
    assert out[0] == out[1]
    ti = load_torrent(out[0], items)
    assert ti.info_hashes().has_v2()
    # small items packed: [40000, 200, 3000] | [70000] | [9000], in set order
    assert [(f.size, f.bundle) for f in layout(items)] == [(43200, True), (70000, False),
                                                          (9000, True)]
    with pytest.raises(ValueError):   # a torrent of another set is refused
        load_torrent(out[0], items[:2])
    with pytest.raises(ValueError):   # ... and of the same items in another order
        load_torrent(out[0], items[::-1])


@pytest.mark.parametrize("tree", [MIXED], indirect=True)
def test_small_items_travel_packed(tree, nodes, tmp_path):
    """Small chunks are packed into bundles (a few pieces, not one per chunk), and three
    nodes still get every chunk, verified, the origin serving the set about once."""
    store, _, _, set_bytes = tree
    publish(tree, tmp_path)
    group = [nodes(n, nodes=3) for n in (1, 2, 3)]
    refs = group[0].reader.all_chunks()
    key = set_key(set_items(refs))
    ti = load_torrent(store.read(store.get_ref(f"peers/torrents/{key}")), set_items(refs))
    assert ti.num_pieces() < len(refs) / 10, (ti.num_pieces(), len(refs))
    sent0 = store.sent
    stats = run_all(group)
    assert store.sent - sent0 < 1.6 * set_bytes, (store.sent - sent0, stats)
    assert all(s["peer_bytes"] > 0 for s in stats), stats


def test_hot_set_to_three_nodes_costs_the_origin_once(tree, nodes):
    _, _, _, set_bytes = tree
    group = [nodes(n, nodes=3) for n in (1, 2, 3)]
    stats = run_all(group)
    origin = sum(s["origin_bytes"] for s in stats)
    assert origin < 1.5 * set_bytes, stats
    assert sum(s["peer_bytes"] for s in stats) >= set_bytes, stats
    assert sorted(n.share.stats["role"] for n in group) == ["maker", "peer", "peer"]


@pytest.mark.parametrize("tree", [LARGE, MIXED], indirect=True, ids=["large", "mixed"])
def test_published_torrent_every_node_joins_at_once(tree, nodes, tmp_path):
    """The torrent came with the profile: no maker, nobody waits for anybody's whole fetch.
    Each node takes its dealt part from the origin and the rest from the others."""
    store, _, _, set_bytes = tree
    publish(tree, tmp_path)
    group = [nodes(n, nodes=3) for n in (1, 2, 3)]
    sent0 = store.sent
    stats = run_all(group)
    assert store.sent - sent0 < 1.6 * set_bytes, (store.sent - sent0, stats)
    assert [n.share.stats["role"] for n in group] == ["peer"] * 3
    # in parallel: at least two nodes fetched a part from the origin, everyone got peers' parts
    assert sum(1 for s in stats if s["origin_bytes"] > 0) >= 2, stats
    assert all(s["peer_bytes"] > 0 for s in stats), stats


@pytest.mark.parametrize("tree", [LARGE, MIXED], indirect=True, ids=["large", "mixed"])
def test_chunks_in_the_node_cache_are_seeded_not_fetched(tree, nodes, tmp_path):
    """A node whose cache holds the set fetches nothing and seeds it from there (its
    entries linked into the seed copy); a node holding half fetches only the other half."""
    store, _, _, set_bytes = tree
    publish(tree, tmp_path)
    # a peer that stalls takes the rest from the origin (a feature): under a loaded
    # machine's pauses the origin's count would then measure load, not the cache
    full = nodes(1, nodes=3, stall_s=20.0)
    half = nodes(2, nodes=3, stall_s=20.0)
    refs = full.reader.all_chunks()
    for ref in refs:
        full.cache.put(ref.digest, full.reader.chunk(ref))
    for ref in refs[::2]:
        half.cache.put(ref.digest, full.reader.chunk(ref))
    sent0 = store.sent
    full.run()
    half.run()
    st_full, st_half = full.wait(), half.wait()
    assert st_full["already_local"] == len(refs), st_full
    assert st_full["origin_bytes"] == st_full["peer_bytes"] == 0, st_full
    assert st_half["already_local"] == len(refs[::2]), st_half
    assert half.has_all()
    # what the node had is not fetched again, the rest came from the other node's cache
    assert st_half["fetched_chunks"] == len(refs) - len(refs[::2]), st_half
    assert store.sent == sent0, "every chunk was in some node's cache"
    empty = nodes(3, nodes=3, stall_s=20.0).run()   # everything from the two caches
    st = empty.wait()
    assert empty.has_all() and st["origin_bytes"] == 0, st


def test_the_roster_is_read_at_join_and_on_knocks_only(tree, nodes, tmp_path):
    publish(tree, tmp_path)
    group = [nodes(n, nodes=2) for n in (1, 2)]
    for node in group:
        node.run()
    for node in group:
        node.wait()
    reads = [n.share.roster_reads for n in group]
    assert all(r <= 8 for r in reads), reads    # join (a few, while the others announce)
    time.sleep(1.5)
    assert [n.share.roster_reads for n in group] == reads   # and nothing since


def test_all_peers_firewalled_is_a_plain_origin_fetch(tree, nodes, tmp_path):
    """Every peer unreachable (the announced port refuses): the node fetches the whole set
    from the origin at once, no slower than without peers by more than 10 %."""
    import socket

    from bootseer.peers import roster
    store, _, _, set_bytes = tree
    publish(tree, tmp_path)
    baseline = nodes(1, peers=False)
    t0 = time.monotonic()
    baseline.run().wait()
    origin_only = time.monotonic() - t0
    with socket.socket() as closed:                 # a port where nobody listens
        closed.bind(("127.0.0.9", 0))
        port = closed.getsockname()[1]
    roster.announce(store, JOB, "walled", f"127.0.0.9:{port}")
    alone = nodes(2, nodes=2)
    t0 = time.monotonic()
    stats = alone.run().wait()
    with_peers = time.monotonic() - t0
    assert alone.has_all() and stats["peer_bytes"] == 0, stats
    # 10 % plus 1 s for the session's start on a loaded 2-core machine: waiting on a peer
    # (a connect or piece timeout) takes several seconds and still fails this
    assert with_peers <= 1.1 * origin_only + 1.0, (with_peers, origin_only)


def test_peer_gone_mid_transfer_rest_from_origin(tree, nodes):
    _, _, _, set_bytes = tree
    seeder = nodes(1, upload_cap=1 << 20).run()   # ~4 MiB at 1 MiB/s: seconds
    seeder.wait()
    assert seeder.share.stats["role"] == "maker"
    late = nodes(2, stall_s=3.0).run()   # the first connection takes a second or two
    deadline = time.monotonic() + 30
    while late.prefetcher.stats["peer_bytes"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    seeder.close()                                  # gone mid-transfer
    stats = late.wait()
    assert late.has_all()
    assert 0 < stats["peer_bytes"] < set_bytes, stats
    assert 0 < stats["origin_bytes"] < set_bytes, stats


def test_restarted_job_finds_the_torrent_but_no_seed_and_still_shares(tree, nodes):
    """A torrent published by an earlier job says nothing about who has the bytes now: the
    new job's maker takes the set from the origin and seeds each chunk as it arrives."""
    _, _, _, set_bytes = tree
    earlier = nodes(1, job="earlier").run()
    earlier.wait()
    earlier.close()
    group = [nodes(n, job="restarted", nodes=2) for n in (2, 3)]
    stats = run_all(group)
    assert sum(s["origin_bytes"] for s in stats) < 1.5 * set_bytes, stats
    # the torrent is known: nobody makes it, both join at once
    assert sorted(n.share.stats["role"] for n in group) == ["peer", "peer"]


def test_node_cache_full_while_seeding(tree, nodes):
    """A node whose cache holds almost nothing still gets the set (verified) and seeds it:
    what peers fetch from it is its own copy for seeding, not its node cache."""
    _, _, _, set_bytes = tree
    maker = nodes(1, cache_budget=1 << 20).run()
    maker.wait()
    assert not maker.has_all()                     # most of the set did not fit
    joiner = nodes(2).run()
    stats = joiner.wait()
    assert joiner.has_all()
    # the join may take a chunk or two from the origin while the maker calls it back
    assert stats["peer_bytes"] >= 0.5 * stats["planned_bytes"], stats


def test_upload_cap_holds_on_a_private_network(tree, nodes):
    """libtorrent exempts local networks from rate limits by default; a job's network is
    one, so the cap must be made to apply there."""
    _, _, _, set_bytes = tree
    seeder = nodes(1, upload_cap=2 << 20).run()
    seeder.wait()
    t0 = time.monotonic()
    joiner = nodes(2, stall_s=5.0).run()
    stats = joiner.wait()
    assert stats["peer_bytes"] > 0, stats
    # what came from the seeder came no faster than its cap
    assert time.monotonic() - t0 >= 0.75 * stats["peer_bytes"] / (2 << 20)


def test_a_restart_of_the_same_job_has_its_own_maker(tree, nodes):
    """Attempt 0's maker is gone; attempt 1 must not wait for it."""
    _, _, _, set_bytes = tree
    first = nodes(1, job="same").run()
    first.wait()
    first.close()
    group = [nodes(n, job="same", attempt=1, stall_s=30.0, nodes=2) for n in (2, 3)]
    stats = run_all(group)
    assert sum(s["origin_bytes"] for s in stats) < 1.5 * set_bytes, stats
    # attempt 0 published the torrent: attempt 1's nodes join at once, nobody makes it
    assert sorted(n.share.stats["role"] for n in group) == ["peer", "peer"]


def _corrupt_in_place(node: Node) -> int:
    """Flip bytes inside every file the node seeds (same size, same inode: libtorrent
    serves them as they are now)."""
    n = 0
    for dirpath, _, names in os.walk(node.share.work_dir):
        for name in names:
            with open(os.path.join(dirpath, name), "r+b") as f:
                f.seek(100)
                f.write(b"\xff" * 64)
            n += 1
    return n


@pytest.mark.parametrize("tree", [LARGE, MIXED], indirect=True, ids=["large", "mixed"])
def test_lying_peer_is_banned_and_its_chunks_refetched(tree, nodes):
    liar = nodes(1).run()          # fetched from the origin, made and published the torrent
    liar.wait()
    assert _corrupt_in_place(liar) > 0
    # libtorrent finds the liar by v2 block hashes (it may ask for them first): seconds
    victim = nodes(2, stall_s=6.0).run()
    stats = victim.wait()
    assert victim.has_all()                       # nothing corrupt was cached
    assert "127.0.0.2" in victim.share.swarm.banned, (stats, victim.share.stats)
    assert stats["origin_bytes"] > 0


def test_torrent_that_lies_is_caught_by_the_digest(tree, nodes, tmp_path):
    """libtorrent's hashes only check data against the torrent: a published torrent made
    from wrong bytes passes them, and the chunk digest (the trust root) catches it."""
    store, digest, profile, set_bytes = tree
    r = TreeReader(store, digest, Fetcher(FetchConfig()))
    refs = r.all_chunks()
    items = set_items(refs)
    bad = tmp_path / "bad"
    write_seed_copy(bad, items, {i.digest: os.urandom(i.size) for i in items})
    from bootseer.peers.transfer import torrent_ref
    data = make_torrent(str(bad), items)
    store.write(sha256_digest(data), data)
    store.set_ref(torrent_ref(set_key(items)), sha256_digest(data))
    liar = nodes(1)
    # the liar is the job's maker and seeds the wrong bytes under the published torrent
    assert store.set_ref(f"peers/{JOB}/maker/0/{set_key(items)}", liar.share.announcement,
                         exclusive=True)
    liar.share.swarm.add(load_torrent(data, items), str(bad))
    liar.share.handles.append(liar.share.swarm.session.get_torrents()[0])
    victim = nodes(2, stall_s=2.0).run()
    stats = victim.wait()
    assert victim.has_all()
    assert victim.share.stats["rejected"] >= 1
    assert stats["origin_bytes"] > 0


def test_no_peer_reachable_is_a_pure_origin_fetch(tree, nodes):
    _, _, _, set_bytes = tree
    first = nodes(1).run()
    first.wait()
    first.close()                                  # announced, published, now unreachable
    # wait_s beyond the test's timeout: a node that waited for it fails, however loaded
    # the machine is
    alone = nodes(2, stall_s=1.0, wait_s=600.0).run()
    stats = alone.wait()
    assert alone.has_all()
    assert stats["peer_bytes"] == 0
    assert stats["origin_bytes"] >= set_bytes


def test_share_for_follows_the_settings(tmp_path):
    store = open_store(str(tmp_path / "store"))

    def cfg(**peers):
        return BootseerConfig.from_dict({"peers": peers, "trace": {"job_id": "j1"},
                                         "cache": {"dir": str(tmp_path / "c")}})
    assert share_for(cfg(mode="off", nodes=8), store) is None
    assert share_for(cfg(mode="auto", nodes=1), store) is None
    share = share_for(cfg(mode="auto", nodes=2, interface="127.0.0.9",
                          port_min=21900, port_max=21909), store)
    try:
        assert share is not None and share.swarm.addr.startswith("127.0.0.9:")
        assert share.wants(64 * 1024**2) and not share.wants(64 * 1024**2 - 1)
        assert share_for(cfg(mode="auto", nodes=2, interface="127.0.0.9"), store) is share
    finally:
        share.close()


def test_tree_session_prefetch_uses_peers_and_traces_the_bytes(tree, tmp_path):
    """The seam: a lazily mounted tree's session prefetches from the job's peers when the
    settings say so, and the start's trace attributes say how many bytes came from where."""
    from bootseer.peers import _shares
    from bootseer.tree.session import TreeSession, window_attrs
    store, digest, profile, set_bytes = tree
    sessions = []
    try:
        for n in (1, 2):
            config = BootseerConfig.from_dict({
                "store": {"url": store.url},
                "cache": {"dir": str(tmp_path / f"s{n}" / "cache")},
                "trace": {"job_id": "job-seam", "node": f"seam{n}"},
                "peers": {"mode": "auto", "nodes": 2, "min_set_bytes": 0,
                          "interface": f"127.0.0.{20 + n}", "port_min": 21500,
                          "port_max": 21599}})
            s = TreeSession(config, digest, str(tmp_path / f"s{n}" / "state"), profile=profile,
                            window_timeout_s=60)
            sessions.append(s)
            s.prefetcher.wait(60)
        attrs = [window_attrs(s.figures().doc()) for s in sessions]
        assert attrs[0]["prefetch_peers_role"] == "maker"
        assert attrs[0]["prefetch_origin_bytes"] >= set_bytes
        assert attrs[1]["prefetch_peers_role"] == "peer"
        # the session's origin is this machine's disk, as fast as any peer: each chunk
        # comes from whichever source is first, and the two figures add up to the set
        planned = sessions[1].prefetcher.stats["planned_bytes"]
        assert attrs[1]["prefetch_peer_bytes"] + attrs[1]["prefetch_origin_bytes"] >= planned
    finally:
        for s in sessions:
            s.finish()
        for key in [k for k in _shares if k[0] == "job-seam"]:
            _shares.pop(key).close()


def test_node_address_from_an_address_a_device_or_the_route_to_the_store():
    from bootseer.peers.address import node_ip
    assert node_ip("127.0.0.7", "/tmp/store") == "127.0.0.7"
    assert node_ip("lo", "/tmp/store") == "127.0.0.1"
    assert node_ip(None, "oci://127.0.0.1:5000/bootseer") == "127.0.0.1"


def test_seed_copies_no_process_holds_are_removed(tmp_path):
    from bootseer.peers.seedcopy import hold_set, remove_unused_sets
    held, dropped = tmp_path / "a", tmp_path / "b"
    for d in (held, dropped):
        d.mkdir()
        (d / "chunk").write_bytes(b"x")
    lock = hold_set(held)
    hold_set(dropped).close()          # its process is gone
    try:
        remove_unused_sets(tmp_path)
        assert (held / "chunk").exists()
        assert not dropped.exists()
    finally:
        lock.close()


def test_a_stranger_knocking_makes_the_roster_be_read_once_in_a_while():
    """A refused call from an address not on the roster (a node that joined later, or a
    stranger) makes the node read the roster; the same address again only every 2 s."""
    from bootseer.peers import swarm as swarm_mod
    s = Swarm("127.0.0.60", port_min=21960, port_max=21969)
    try:
        s._knock("10.9.9.9")
        assert s.knocked.is_set()
        s.knocked.clear()
        for _ in range(50):
            s._knock("10.9.9.9")
        assert not s.knocked.is_set()
        s._knock(s.ip)                                  # its own calls are no knock
        s.admit(["127.0.0.61:21970"])
        s._knock("127.0.0.61")                          # nor are a member's
        assert not s.knocked.is_set()
        s.knockers["10.9.9.9"] -= swarm_mod.KNOCK_REPEAT_S
        s._knock("10.9.9.9")
        assert s.knocked.is_set()
    finally:
        s.close()


def test_a_knock_from_a_node_admitted_meanwhile_costs_no_roster_read(tmp_path):
    """Nodes started together call each other before all have read the roster: the call
    is refused (a knock), then the node's own read at join admits the caller. That knock
    needs no second read (at N = 8 each such read was a second of a busy store's time)."""
    from bootseer.peers import roster
    store = open_store(str(tmp_path / "store"))
    share = PeerShare(store, Swarm("127.0.0.62", port_min=21980, port_max=21989), JOB, "a",
                      str(tmp_path / "peers"), PeersConfig(mode="on"), refresh_s=0.05)
    try:
        roster.announce(store, JOB, "b", "127.0.0.63:21990")
        share.swarm._knock("127.0.0.63")      # b called before a read the roster again
        share.read_roster()                   # a's read at join admits b
        reads = share.roster_reads
        time.sleep(0.5)
        assert share.roster_reads == reads
        share.swarm._knock("127.0.0.64")      # a node that announced after: read
        roster.announce(store, JOB, "c", "127.0.0.64:21991")
        deadline = time.monotonic() + 5
        while share.roster_reads == reads and time.monotonic() < deadline:
            time.sleep(0.02)
        assert share.roster_reads == reads + 1
        assert "127.0.0.64" in share.swarm.members
    finally:
        share.close()


def test_a_transfer_asks_libtorrent_for_its_state_a_few_times_a_second(tree, nodes, tmp_path,
                                                                       monkeypatch):
    """A set's transfer wakes on piece events (finished, read back) and asks libtorrent for
    peers and availability every TICK_S; it does not walk every piece's state in a tight
    loop (each such call waits for libtorrent's network thread: at N = 8 on 2 cores that
    loop was the node's bottleneck)."""
    from collections import Counter

    import libtorrent as lt

    from bootseer.peers import transfer as transfer_mod
    calls: Counter = Counter()
    real_add = Swarm.add

    class Counting:
        def __init__(self, handle):
            self._h = handle

        def __getattr__(self, name):
            attr = getattr(self._h, name)

            def call(*args, **kw):
                calls[name] += 1
                if name == "status" and args and args[0] & lt.torrent_handle.query_pieces:
                    calls["status with pieces"] += 1
                return attr(*args, **kw)
            return call if callable(attr) else attr

    monkeypatch.setattr(Swarm, "add", lambda self, *a, **kw: Counting(real_add(self, *a, **kw)))
    publish(tree, tmp_path)
    group = [nodes(n, nodes=3) for n in (1, 2, 3)]
    t0 = time.monotonic()
    for node in group:
        node.run()
    for node in group:
        node.wait()
    seconds = time.monotonic() - t0
    assert all(node.has_all() for node in group)
    assert calls["read_piece"] > 0, calls              # pieces did come from peers
    ticks = len(group) * (seconds / transfer_mod.TICK_S + 2)
    assert calls["get_peer_info"] <= ticks + 2 * len(group), (calls, seconds)
    assert calls["status with pieces"] <= len(group), calls   # once each, at attach


def test_two_transfers_of_one_set_in_one_process_both_finish(tree, nodes, tmp_path):
    """Two transfers of the same set in one process share the torrent's event queue: an
    origin fetch's 'done' taken by the other transfer must not leave this one waiting."""
    publish(tree, tmp_path)
    node = nodes(1)
    chunks = TreeChunks(node.reader, node.prefetcher.plan)
    transfers = [node.share.open_set(chunks.items, chunks, {}) for _ in range(2)]
    stop = threading.Event()
    left: dict[int, list] = {}
    threads = [threading.Thread(target=lambda i=i, t=t: left.__setitem__(i, t.fetch(stop)))
               for i, t in enumerate(transfers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    stop.set()
    assert left == {0: [], 1: []}, {i: len(v) for i, v in left.items()}
    assert node.has_all()


def test_a_maker_gone_frees_the_others_long_before_wait_s(tree, nodes):
    """The node that claimed to make the set's torrent died: its peer port refuses, so a
    node waiting for the torrent goes to the origin within seconds, not after wait_s."""
    import json
    import socket
    store, _, _, set_bytes = tree
    node = nodes(1, wait_s=600.0)   # beyond the test's timeout: waiting for it fails
    chunks = TreeChunks(node.reader, node.prefetcher.plan)
    transfer = node.share.open_set(chunks.items, chunks)
    with socket.socket() as s:   # a port nobody listens on any more
        s.bind(("127.0.0.9", 0))
        dead = f"127.0.0.9:{s.getsockname()[1]}"
    blob = json.dumps({"node": "gone", "addr": dead}).encode()
    store.write(sha256_digest(blob), blob)
    assert store.set_ref(transfer._maker_ref(), sha256_digest(blob), exclusive=True)
    stats = node.run().wait()
    assert stats["peers_role"] == "origin"
    assert node.has_all() and stats["origin_bytes"] >= set_bytes
