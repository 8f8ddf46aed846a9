"""Bytes by source in the report: per node and per pipeline (image, deps, ckpt), bytes from
the origin and from the job's peers, read from what each pipeline traced; an attribute
that is absent is "not traced", never zero."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bootseer.report import load
from bootseer.report.summary import summarize
from bootseer.report.views import attempts
from tests.trace.report_traces import NodeTrace

pytestmark = pytest.mark.timeout(120)
MiB = 2**20


def _node(root, name, *, image=None, deps=None, kernel_deps=None, ckpt=(), ready=10.0,
          attempt=0):
    """A node of a start: ``image`` the ``image.window`` mark's attributes, ``deps`` a
    snapshot restore's (origin, peers, role, fetched: the emitted deps.fetch's bytes),
    ``kernel_deps`` a kernel restore's deps.fetch attributes, ``ckpt`` one ckpt.load's
    attributes per rank."""
    t = NodeTrace(root, name, attempt=attempt)
    t.span("image.lazy", 0.0, 4.0)
    if deps is not None:
        origin, peers, role, fetched = deps
        t.span("deps.restore", 0.0, 3.0)
        peer_attrs = {} if peers is None else {"origin_bytes": origin, "peer_bytes": peers,
                                               "peers_role": role}
        t.span("deps.extract", 0.1, 2.9, parent="deps.restore", bytes=999 * MiB, **peer_attrs)
        t.span("deps.fetch", 0.1, 2.0, bytes=fetched, requests=3)
    if kernel_deps is not None:
        t.span("deps.restore", 0.0, 3.0)
        t.span("deps.fetch", 0.1, 2.0, parent="deps.restore", **kernel_deps)
    for rank, attrs in enumerate(ckpt):
        t.span("ckpt.load", 5.0, 6.0, pid=200 + rank, rank=rank, bytes_consumed=10 * MiB,
               **attrs)
        t.mark("ready", ready, pid=200 + rank, rank=rank)
    if not ckpt:
        t.mark("ready", ready)
    if image is not None:
        t.mark("image.window", ready + 0.1, coverage=0.9, **image)
    t.write()


def _summary(root, attempt=0):
    (view,) = [v for v in attempts(load.load(root / "job").events)
               if v.attempt == attempt]
    return summarize(view)


def _peers_job(root, attempt=0):
    """Three nodes with peers: n0 made the sets (from the origin), n1 and n2 took them
    from peers; n2 restored its environment with the kernel backend."""
    hot = 64 * MiB
    _node(root, "n0", attempt=attempt,
          image={"store_bytes": hot + 2 * MiB, "prefetch_origin_bytes": hot,
                 "prefetch_peer_bytes": 0, "prefetch_peers_role": "maker"},
          deps=(40 * MiB, 0, "maker", 41 * MiB),
          ckpt=[{"bytes_fetched": 100 * MiB, "peer_bytes": 0, "peers_role": "maker"},
                {"bytes_fetched": 100 * MiB, "peer_bytes": 0, "peers_role": "maker"}])
    _node(root, "n1", attempt=attempt,
          image={"store_bytes": 2 * MiB, "prefetch_origin_bytes": 0,
                 "prefetch_peer_bytes": hot, "prefetch_peers_role": "peer"},
          deps=(0, 40 * MiB, "peer", 1 * MiB),
          ckpt=[{"bytes_fetched": 0, "peer_bytes": 100 * MiB, "peers_role": "peer"},
                {"bytes_fetched": 0, "peer_bytes": 100 * MiB, "peers_role": "peer"}])
    _node(root, "n2", attempt=attempt,
          image={"store_bytes": 3 * MiB, "prefetch_origin_bytes": 1 * MiB,
                 "prefetch_peer_bytes": hot - MiB, "prefetch_peers_role": "peer"},
          # the peers brought most; the blob's fetch took the rest from the store
          kernel_deps={"origin_bytes": 2 * MiB, "peer_bytes": 38 * MiB, "peers_role": "peer",
                       "bytes": 1 * MiB, "blob_bytes": 50 * MiB},
          ckpt=[{"bytes_fetched": 5 * MiB, "peer_bytes": 195 * MiB, "peers_role": "peer"}])


def test_bytes_from_origin_and_peers_per_node_and_pipeline(tmp_path):
    _peers_job(tmp_path)
    s = _summary(tmp_path)
    assert s.node_sources["n0"] == {"image": [66 * MiB, 0, "maker"],
                                    "deps": [41 * MiB, 0, "maker"],     # deps.fetch's bytes
                                    "ckpt": [200 * MiB, 0, "maker"]}    # both ranks
    assert s.node_sources["n1"] == {"image": [2 * MiB, 64 * MiB, "peer"],
                                    "deps": [1 * MiB, 40 * MiB, "peer"],
                                    "ckpt": [0, 200 * MiB, "peer"]}
    # a kernel restore: the peers' origin part and the blob's fetch after them
    assert s.node_sources["n2"]["deps"] == [3 * MiB, 38 * MiB, "peer"]
    image = s.sources["image"]
    assert (image["origin"], image["peers"]) == (71 * MiB, 127 * MiB)
    assert image["peer_share"] == pytest.approx(127 / 198)
    assert (image["nodes"], image["peer_nodes"]) == (3, 3)
    assert image["roles"] == {"maker": 1, "peer": 2}
    assert (s.sources["ckpt"]["origin"], s.sources["ckpt"]["peers"]) == (205 * MiB, 395 * MiB)
    total = s.sources["all"]
    assert total["origin"] == (71 + 45 + 205) * MiB
    assert total["peers"] == (127 + 78 + 395) * MiB
    assert total["peer_share"] == pytest.approx(600 / 921)
    assert total["nodes"] == 3
    assert total["most_origin"] == {"node": "n0", "origin": (66 + 41 + 200) * MiB}


def test_without_peers_the_origin_is_traced_and_the_peers_are_not(tmp_path):
    """A start from before peers (or with them off): origin bytes only; a pipeline a node
    did not trace is absent there, not zero."""
    _node(tmp_path, "n0", image={"store_bytes": 64 * MiB}, deps=(None, None, None, 40 * MiB),
          ckpt=[{"bytes_fetched": 100 * MiB}])
    _node(tmp_path, "n1", image={"store_bytes": 60 * MiB}, ckpt=[{"stall_s": 0.1}])
    s = _summary(tmp_path)
    assert s.node_sources == {"n0": {"image": [64 * MiB, None, None],
                                     "deps": [40 * MiB, None, None],
                                     "ckpt": [100 * MiB, None, None]},
                              "n1": {"image": [60 * MiB, None, None]}}
    assert s.sources["image"] == {"origin": 124 * MiB, "peers": None, "peer_share": None,
                                  "nodes": 2, "peer_nodes": 0, "roles": {}}
    assert s.sources["deps"]["nodes"] == 1 and s.sources["ckpt"]["nodes"] == 1
    assert s.sources["all"]["peers"] is None and s.sources["all"]["peer_share"] is None


def test_a_trace_without_byte_counts_has_no_sources(tmp_path):
    _node(tmp_path, "n0", image={"stall_s": 0.1}, ckpt=[{"stall_s": 0.2}])
    s = _summary(tmp_path)
    assert s.sources == {} and s.node_sources == {}


def test_a_peer_share_without_bytes_is_not_a_division_by_zero(tmp_path):
    _node(tmp_path, "n0", image={"store_bytes": 0, "prefetch_peer_bytes": 0,
                                 "prefetch_peers_role": "origin"})
    s = _summary(tmp_path)
    assert s.sources["image"]["peer_share"] is None
    assert s.sources["image"]["roles"] == {"origin": 1}


def _report(*args):
    return subprocess.run([sys.executable, "-m", "bootseer", "report", *map(str, args)],
                          capture_output=True, text=True)


def test_report_text_and_json_show_bytes_by_source(tmp_path):
    _peers_job(tmp_path / "p2p")
    _node(tmp_path / "base", "n0", image={"store_bytes": 64 * MiB},
          ckpt=[{"bytes_fetched": 200 * MiB}])
    _node(tmp_path / "base", "n1", image={"store_bytes": 64 * MiB},
          ckpt=[{"bytes_fetched": 200 * MiB}])
    r = _report(tmp_path / "p2p" / "job", "--baseline", tmp_path / "base" / "job",
                "--json", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "bytes by source" in out
    ours, against = out.split("bytes from the origin, against the baseline")
    rows = {line.split()[0]: line.split() for line in ours.splitlines()
            if line.split()[:1] in (["image"], ["deps"], ["ckpt"], ["all"])
            and "%" in line}
    assert rows["image"][1:5] == ["71.0", "127", "64", "%"]
    assert rows["ckpt"][1:3] == ["205", "395"]
    assert rows["all"][1:3] == ["321", "600"]
    assert "most from the origin: node n0, 307 MiB (image 66.0, deps 41.0, ckpt 200)" in out
    # against the baseline: the origin's bytes per pipeline
    image = next(x for x in against.splitlines() if x.startswith("image")).split()
    assert image == ["image", "128", "71.0", "45%"]
    (summary,) = json.loads((tmp_path / "r.json").read_text())["attempts"]
    assert summary["sources"]["image"]["origin"] == 71 * MiB
    assert summary["node_sources"]["n1"]["ckpt"] == [0, 200 * MiB, "peer"]
