"""The simulator's peers model (docs/peers.md): the registry serves a job's hot set about
once whatever its size, and each node receives it from its peers at its NIC's rate."""

import pytest

from bootseer.trace import cluster, simulate

LAZY = ("image", "deps", "ckpt", "overlap")


@pytest.mark.parametrize("gpus", [1000, 10000])
def test_peers_cut_the_registry_load_and_the_image_phase_at_scale(gpus):
    without = simulate.project(simulate.SimParams(techniques=LAZY), gpus)
    with_peers = simulate.project(simulate.SimParams(techniques=LAZY + ("peers",)), gpus)
    hot_gb = 0.15 * simulate.SimParams().image_gb
    assert without["registry_gb"] == pytest.approx(without["nodes"] * hot_gb)
    assert with_peers["registry_gb"] == pytest.approx(1.03 * hot_gb)
    assert with_peers["phases"]["image.pull"] < without["phases"]["image.pull"]
    assert with_peers["ready_s"] <= without["ready_s"]


def test_one_node_has_no_peers():
    one = [simulate.project(simulate.SimParams(techniques=t), 8)
           for t in (LAZY, LAZY + ("peers",))]
    assert one[0] == one[1]


def test_the_set_fetch_model():
    p = simulate.SimParams(registry_gbps=10.0, node_gbps=1.0, peer_node_gbps=1.0,
                           peer_join_s=0.5, peer_origin_copies=1.0)
    assert simulate.set_fetch_s(p, 2.0, 100, peers=False) == pytest.approx(20.0)   # 0.1 GB/s each
    assert simulate.set_fetch_s(p, 2.0, 100, peers=True) == pytest.approx(2.5)     # NIC-bound
    assert simulate.set_fetch_s(p, 2.0, 1, peers=True) == pytest.approx(2.0)       # alone


@pytest.mark.timeout(120)
def test_a_simulated_cluster_with_peers_starts_large_jobs_faster(tmp_path):
    runs = {}
    for name, tech in (("lazy", ("image",)), ("peers", ("image", "peers"))):
        simulate.simulate(simulate.SimParams(jobs=2000, seed=1, techniques=tech),
                          str(tmp_path / name))
        runs[name] = cluster.characterize(cluster.read_attempts(tmp_path / name)[0])
    for a, b in zip(runs["peers"]["bins"][3:], runs["lazy"]["bins"][3:]):   # 500 GPUs and up
        assert a["median"] < b["median"], (a, b)
