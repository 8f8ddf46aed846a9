"""The simulator's peers model (docs/peers.md): the registry serves a job's hot set about
once whatever its size, and each node receives it from its peers at its NIC's rate."""

import pytest

from bootseer.report import cluster, simulate

LAZY = ("image", "deps", "ckpt", "overlap")


@pytest.mark.parametrize("gpus", [1000, 10000])
def test_peers_cut_the_registry_load_and_the_image_phase_at_scale(gpus):
    without = simulate.project(simulate.SimParams(techniques=LAZY), gpus)
    with_peers = simulate.project(simulate.SimParams(techniques=LAZY + ("peers",)), gpus)
    hot_gb = 0.15 * simulate.SimParams().image_gb
    assert without.registry_gb == pytest.approx(without.nodes * hot_gb)
    assert with_peers.registry_gb == pytest.approx(1.03 * hot_gb)
    assert with_peers.phases["image.pull"] < without.phases["image.pull"]
    assert with_peers.ready_s <= without.ready_s


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
@pytest.mark.slow
def test_a_simulated_cluster_with_peers_starts_large_jobs_faster(tmp_path):
    runs = {}
    for name, tech in (("lazy", ("image",)), ("peers", ("image", "peers"))):
        simulate.simulate(simulate.SimParams(jobs=2000, seed=1, techniques=tech),
                          str(tmp_path / name))
        runs[name] = cluster.characterize(cluster.read_attempts(tmp_path / name)[0])
    big = zip(runs["peers"]["bins"][3:], runs["lazy"]["bins"][3:], strict=True)  # 500 GPUs, up
    for a, b in big:
        assert a["median"] < b["median"], (a, b)


@pytest.mark.parametrize("gpus", [1000, 10000])
def test_peers_share_the_checkpoint_among_replicas(gpus):
    lazy = simulate.project(simulate.SimParams(techniques=LAZY, ckpt_shared_by=8), gpus)
    peers = simulate.project(simulate.SimParams(techniques=LAZY + ("peers",),
                                                ckpt_shared_by=8), gpus)
    assert peers.storage_gb == pytest.approx(lazy.storage_gb / 8 * 1.03)
    assert peers.phases["ckpt.load"] < lazy.phases["ckpt.load"]
    assert peers.ready_s < lazy.ready_s
    # every node its own shard: nothing to share, nothing changes
    own = [simulate.project(simulate.SimParams(techniques=t), gpus)
           for t in (LAZY, LAZY + ("peers",))]
    assert own[0].phases["ckpt.load"] == own[1].phases["ckpt.load"]
    assert own[0].storage_gb == own[1].storage_gb


def test_the_checkpoint_fetch_model():
    p = simulate.SimParams(techniques=("ckpt", "peers"), storage_gbps=10.0, node_gbps=1.0,
                           peer_join_s=0.5, peer_origin_copies=1.0, ckpt_shared_by=4)
    # 100 nodes of 2 GB each, 25 distinct: storage 50 GB at 20 GB/s, each node at 4 GB/s
    assert simulate.ckpt_fetch_s(p, 2.0, 100) == pytest.approx(0.5 + 2.5)
    alone = simulate.SimParams(techniques=("ckpt",), storage_gbps=10.0, node_gbps=1.0)
    assert simulate.ckpt_fetch_s(alone, 2.0, 100) == pytest.approx(10.0)   # 0.2 GB/s each


def test_simulate_cli_refuses_a_bad_shared_by(tmp_path, capsys):
    from bootseer.cli.main import main
    assert main(["simulate", str(tmp_path / "o"), "--jobs", "5", "--ckpt-shared-by", "0"]) != 0
    assert "--ckpt-shared-by" in capsys.readouterr().err
    assert main(["simulate", str(tmp_path / "o"), "--jobs", "5", "--techniques", "all",
                 "--ckpt-shared-by", "8"]) == 0
