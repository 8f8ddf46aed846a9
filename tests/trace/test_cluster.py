"""Simulator calibration, technique projection, and cluster analysis over both input forms."""

import json
import subprocess
import sys

import pytest

from bootseer.report import cluster, simulate

BOOTSEER = [sys.executable, "-m", "bootseer"]


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    simulate.simulate(simulate.SimParams(jobs=5000, seed=0), str(root / "base"), events_jobs=2)
    simulate.simulate(simulate.SimParams(jobs=5000, seed=0, techniques=simulate.TECHNIQUES),
                      str(root / "all"))
    return root


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_default_calibration_reproduces_the_figures(sims):
    recs, notes = cluster.read_attempts(sims / "base")
    c = cluster.characterize(recs)
    assert not notes and c["jobs"] == 5000
    for b, target in zip(c["bins"], simulate.TARGET_MEDIANS, strict=True):
        assert b["median"] == pytest.approx(target, rel=0.15), b
    assert c["lost_share"] == pytest.approx(0.035, abs=0.005)
    assert c["restarts"]["jobs_with_restarts"] > 0


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_techniques_cut_startup_in_every_bin(sims, tmp_path):
    base = cluster.characterize(cluster.read_attempts(sims / "base")[0])
    new = cluster.characterize(cluster.read_attempts(sims / "all")[0])
    for a, b in zip(new["bins"], base["bins"], strict=True):
        assert a["median"] < 0.6 * b["median"], (a, b)
    assert new["lost_share"] < 0.5 * base["lost_share"]
    r = subprocess.run([*BOOTSEER, "analyze", str(sims / "all"), "--baseline", str(sims / "base"),
                        "--html", str(tmp_path / "a.html"), "--json", str(tmp_path / "a.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "share of cluster GPU time lost to startup" in r.stdout and "GPU time lost" in r.stdout
    assert ">3000" in r.stdout and "restarts:" in r.stdout
    page = (tmp_path / "a.html").read_text()
    assert page.count("<svg") == 2 and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert json.loads((tmp_path / "a.json").read_text())["bins"][0]["bin"] == "1-10"


@pytest.mark.timeout(120)
def test_simulated_traces_are_reportable_and_analyzable(sims):
    traces = sims / "base" / "traces"
    job = sorted(p for p in traces.iterdir())[0]
    r = subprocess.run([*BOOTSEER, "report", str(job)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "gated by node node" in r.stdout and "image.pull" in r.stdout
    recs, notes = cluster.read_attempts(traces)   # real-trace form: summarized per attempt
    assert {x["job"] for x in recs} == {"sim-00000", "sim-00001"}
    assert any("train.end" in n for n in notes)
    c = cluster.characterize(recs)
    assert c["lost_share"] is None and c["attempts"] == len(recs)


def test_bad_input(tmp_path):
    r = subprocess.run([*BOOTSEER, "simulate", str(tmp_path / "o"), "--techniques", "image,gpus"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "unknown technique(s) gpus" in r.stderr
    assert not (tmp_path / "o").exists()
    r = subprocess.run([*BOOTSEER, "analyze", str(tmp_path / "nope")], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "no cluster trace at" in r.stderr
    (tmp_path / "c.jsonl").write_text('{"kind": "simulation"}\ngarbage\n')
    with pytest.raises(Exception, match="holds no job attempts"):
        cluster.read_attempts(tmp_path / "c.jsonl")
