"""Prefetch plans from DCP .metadata and safetensors headers, read over a real nginx."""

from __future__ import annotations

import json
import struct

import pytest

from bootseer.ckpt.plan import PlanError, Range, dcp_plan, merge, safetensors_plan, split
from bootseer.ckpt.engine import Engine
from bootseer.config import CkptConfig

pytestmark = pytest.mark.timeout(60)


def opener(engine):
    from bootseer.ckpt.api import open as ckpt_open
    return lambda url: ckpt_open(url, engine=engine)


def write_safetensors(path, tensors: dict[str, bytes]) -> dict:
    header, off = {}, 0
    for k, b in tensors.items():
        header[k] = {"dtype": "U8", "shape": [len(b)], "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(tensors.values()))
    return header


@pytest.mark.torch
def test_dcp_plan_covers_every_byte_the_load_reads(nginx_factory, tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    d = tmp_path / "dcp"
    dcp.save({"a": torch.ones(1000), "b": torch.zeros(10, 10)}, checkpoint_id=str(d))
    server = nginx_factory(d)
    e = Engine(CkptConfig(stripe_bytes=64 * 1024, memory_budget_bytes=1 << 20))
    try:
        plan = dcp_plan(server.url, opener=opener(e))
    finally:
        e.close()
    files = {p.name: p.stat().st_size for p in d.iterdir() if p.name != ".metadata"}
    assert {r.path for r in plan} == set(files)
    assert all(0 <= r.start < r.end <= files[r.path] for r in plan)
    assert sum(r.length for r in merge(plan, gap=4096)) <= sum(files.values())


def test_dcp_plan_of_a_non_checkpoint_is_a_clear_error(nginx, www):
    (www / ".metadata").write_bytes(b"not a pickle")
    e = Engine(CkptConfig(stripe_bytes=64 * 1024, memory_budget_bytes=1 << 20))
    try:
        with pytest.raises(PlanError, match="not a DCP metadata"):
            dcp_plan(nginx.url, opener=opener(e))
    finally:
        e.close()


def test_safetensors_plan_headers_first(nginx, www):
    write_safetensors(www / "m1.safetensors", {"x": b"a" * 100, "y": b"b" * 50})
    write_safetensors(www / "m2.safetensors", {"z": b"c" * 10})
    e = Engine(CkptConfig(stripe_bytes=64 * 1024, memory_budget_bytes=1 << 20))
    try:
        plan = safetensors_plan(nginx.url, ["m1.safetensors", "m2.safetensors"],
                                opener=opener(e))
    finally:
        e.close()
    assert [r.start for r in plan[:2]] == [0, 0]  # both headers before any tensor
    body = (www / "m1.safetensors").read_bytes()
    x = next(r for r in plan[2:] if r.path == "m1.safetensors")
    assert body[x.start:x.end] == b"a" * 100
    (www / "bad.safetensors").write_bytes(b"\xff" * 16)
    e = Engine(CkptConfig(stripe_bytes=64 * 1024, memory_budget_bytes=1 << 20))
    try:
        with pytest.raises(PlanError, match="not plausible"):
            safetensors_plan(nginx.url, ["bad.safetensors"], opener=opener(e))
    finally:
        e.close()


def test_split_shares_cover_the_plan_exactly_once():
    plan = [Range("a", 0, 100), Range("b", 10, 17), Range("c", 0, 1000)]
    shares = [split(plan, r, 3) for r in range(3)]
    seen = sorted((r.path, i) for s in shares for r in s for i in range(r.start, r.end))
    want = sorted((r.path, i) for r in plan for i in range(r.start, r.end))
    assert seen == want
    with pytest.raises(ValueError):
        split(plan, 3, 3)
