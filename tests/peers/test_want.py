"""The one "use peers?" gate (bootseer.peers.wanted), the separate swarms of one job by
namespace, and the origin's segments dealt among nodes (bootseer.peers.deal)."""

from __future__ import annotations

from bootseer.config import BootseerConfig, PeersConfig
from bootseer.peers import _shares, share_for, wanted
from bootseer.peers.deal import SEGMENT_BYTES, Deal
from bootseer.peers.torrent import Member, TorrentFile
from bootseer.store import open_store

MIB = 1 << 20


def test_wanted_follows_the_mode_the_job_size_and_the_set_size():
    auto = PeersConfig(mode="auto", nodes=2, min_set_bytes=MIB)
    assert wanted(auto, MIB) and not wanted(auto, MIB - 1)
    assert wanted(auto)                                    # no set yet: whether to join
    assert not wanted(PeersConfig(mode="auto", nodes=1), 10 * MIB)
    assert not wanted(PeersConfig(mode="auto", nodes=0))   # unknown: one node
    assert not wanted(PeersConfig(mode="off", nodes=8), 10 * MIB)
    assert wanted(PeersConfig(mode="on", nodes=0, min_set_bytes=MIB), 1)
    # where a torrent is made for later starts, the job's size is not asked
    lone = PeersConfig(mode="auto", nodes=0, min_set_bytes=MIB)
    assert wanted(lone, MIB, publishing=True) and not wanted(lone, MIB - 1, publishing=True)
    assert not wanted(PeersConfig(mode="off"), 10 * MIB, publishing=True)


def test_a_namespace_makes_a_swarm_of_its_own_with_its_own_roster(tmp_path):
    store = open_store(str(tmp_path / "store"))
    config = BootseerConfig.from_dict({
        "peers": {"mode": "on", "interface": "127.0.0.10", "port_min": 21940,
                  "port_max": 21949},
        "trace": {"job_id": "j-ns", "node": "n1"}, "cache": {"dir": str(tmp_path / "c")}})
    image, env = share_for(config, store), share_for(config, store, "env")
    try:
        assert image is not None and env is not None and image is not env
        assert (image.group, env.group) == ("j-ns", "j-ns-env")
        assert store.get_ref("peers/j-ns/nodes/n1") == image.announcement
        assert store.get_ref("peers/j-ns-env/nodes/n1") == env.announcement
        assert share_for(config, store, "env") is env
    finally:
        for key in [k for k in _shares if k[0].startswith("j-ns")]:
            _shares.pop(key).close()


def test_segments_dealt_by_rendezvous_hashing():
    files = [TorrentFile(f"{i:06d}-x", SEGMENT_BYTES // 2, (Member(f"sha256:{i:064x}", 0,
                                                                   SEGMENT_BYTES // 2),))
             for i in range(64)]
    nodes = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    deals = {ip: Deal(files, ip) for ip in nodes}
    assert len(deals[nodes[0]].segments) == 32   # two files a segment
    mine = {ip: set(d.mine(nodes)) for ip, d in deals.items()}
    assert set().union(*mine.values()) == set(range(32))           # every segment dealt
    assert sum(len(m) for m in mine.values()) == 32                # once
    # the third node gone: only its segments move, to the other two
    after = {ip: set(deals[ip].mine(nodes[:2])) for ip in nodes[:2]}
    for ip in nodes[:2]:
        assert mine[ip] <= after[ip]
    assert after[nodes[0]] | after[nodes[1]] == set(range(32))
    # alone: every segment, from a point of its own
    assert sorted(deals[nodes[0]].mine([nodes[0]])) == list(range(32))
