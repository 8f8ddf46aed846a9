"""The demo's table says where each start's hot set came from (origin / peers), read from
the nodes' ``image.window`` marks in the trace."""

from __future__ import annotations

from pathlib import Path

from bootseer.demo.scenario import NodeResult
from bootseer.demo.tables import hot_set_sources, render

MiB = 2**20


def result(node: str, t0: float) -> NodeResult:
    summary = {"t0": t0, "ready_s": 20.0,
               "phases": {"image.lazy": {"start": 0.0, "end": 5.0},
                          "job.run": {"start": 5.0, "end": 30.0}}}
    return NodeResult(node, 0, summary, Path("/nonexistent.log"))


def window(node: str, at: float, **attrs) -> dict:
    return {"kind": "mark", "phase": "image.window", "node": node, "start": at, "attrs": attrs}


def test_each_start_sums_its_own_nodes_marks():
    first = [result("node0", 1000.0), result("node1", 1000.0)]
    second = [result("node0", 2000.0), result("node1", 2000.0)]
    events = [window("node0", 1020.0, read_chunks=5),   # a recording start: no prefetch
              window("node1", 1021.0, read_chunks=5),
              window("node0", 2020.0, prefetch_origin_bytes=80 * MiB, prefetch_peer_bytes=0),
              window("node1", 2021.0, prefetch_origin_bytes=0, prefetch_peer_bytes=80 * MiB),
              window("node2", 2021.0, prefetch_origin_bytes=7 * MiB)]   # not in this job
    assert hot_set_sources(events, first) is None
    assert hot_set_sources(events, second) == (80 * MiB, 80 * MiB)
    table = render([("records", first), ("prefetches", second)], events)
    assert "hot set MiB origin / peers" in table.splitlines()[0]
    assert "80 / 80" in table.splitlines()[3]
    assert "origin / peers" not in render([("records", first)])   # no trace: no column


def test_the_checkpoint_bytes_each_node_staged_per_byte_its_ranks_read():
    from bootseer.demo.tables import ckpt_staged_per_read
    second = [result("node0", 2000.0), result("node1", 2000.0)]
    events = [{"kind": "span", "phase": "ckpt.load", "node": "node0", "start": 2009.0,
               "rank": 0, "attrs": {"mode": "dcp"}},   # the job's own phase: no figure
              {"kind": "span", "phase": "ckpt.load", "node": "node0", "start": 2010.0,
               "attrs": {"staged_per_read": 1.02}},
              {"kind": "span", "phase": "ckpt.load", "node": "node1", "start": 2011.0,
               "attrs": {"staged_per_read": 1.3}},
              {"kind": "span", "phase": "ckpt.load", "node": "node1", "start": 1011.0,
               "attrs": {"staged_per_read": 4.0}}]   # an earlier start's
    assert ckpt_staged_per_read(events, second) == 1.3   # the most of any node
    assert ckpt_staged_per_read(events[:2], second[:1]) == 1.02   # past the job's own
    assert ckpt_staged_per_read([], second) is None   # read from a staged copy: no report
    table = render([("prefetches", second)], events)
    assert "ckpt staged/read" in table.splitlines()[0] and "1.30" in table.splitlines()[2]
