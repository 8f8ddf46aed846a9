"""Traces shaped like a real ``bootseer run`` start, written on the fly for the report tests:
per node, the launcher's pipelines (threads of one process) and a training process's
auto-captured phases, with both clocks recorded."""

from __future__ import annotations

import json
from pathlib import Path


class NodeTrace:
    def __init__(self, root: Path, node: str, *, job: str = "job", attempt: int = 0,
                 gpus: int = 8, skew: float = 0.0, base: float = 1_700_000_000.0):
        self.root, self.node, self.job, self.attempt, self.gpus = root, node, job, attempt, gpus
        self.base, self.skew, self.mono_base = base + attempt * 1000.0, skew, 5000.0
        self.lines: dict[int, list[dict]] = {}

    def _event(self, pid, rank, kind, phase, start, end, parent=None, status="ok", **attrs):
        self.lines.setdefault(pid, []).append({
            "v": 1, "job": self.job, "attempt": self.attempt, "node": self.node, "rank": rank,
            "gpus": self.gpus, "pid": pid, "kind": kind, "phase": phase, "parent": parent,
            "start": self.base + self.skew + start, "end": self.base + self.skew + end,
            "mono_start": self.mono_base + start, "mono_end": self.mono_base + end,
            "status": status, "attrs": attrs})
        return self.lines[pid][-1]

    def span(self, phase, start, end, *, pid=100, rank=None, parent=None, **attrs):
        return self._event(pid, rank, "span", phase, start, end, parent, **attrs)

    def mark(self, phase, t, *, pid=100, rank=None, parent=None, **attrs):
        return self._event(pid, rank, "mark", phase, t, t, parent, **attrs)

    def write(self) -> None:
        d = self.root / self.job / str(self.attempt)
        d.mkdir(parents=True, exist_ok=True)
        for pid, events in self.lines.items():
            (d / f"{self.node}-{pid}.jsonl").write_text(
                "".join(json.dumps(e) + "\n" for e in events))


def demo_node(root: Path, node: str, *, image_s: float = 4.0, deps_s: float = 2.5,
              ckpt_s: float = 2.0, imports_s: float = 3.0, arrive_late_s: float = 0.0,
              rendezvous_at: float | None = None, attempt: int = 0, rank: int = 0,
              skew: float = 0.0, first_collective: bool = False) -> NodeTrace:
    """One node of a lazy start: image, deps and checkpoint pipelines side by side, then the
    job (interpreter, imports, init + rendezvous (or init, then the first collective where
    ranks wait), checkpoint load, first step, ready).
    ``rendezvous_at`` (s) is when the slowest rank arrived: this rank waits until then."""
    t = NodeTrace(root, node, attempt=attempt, skew=skew)
    prep = max(image_s, deps_s, ckpt_s) + 0.05     # the launcher joins its pipeline threads
    t.span("startup.prepare", 0.0, prep)
    t.span("image.lazy", 0.001, image_s, mode="lazy")
    t.span("image.mount", 0.01, 0.4, parent="image.lazy")
    t.span("deps.restore", 0.001, deps_s)
    t.span("deps.extract", 0.3, deps_s - 0.1, parent="deps.restore")
    t.span("deps.fetch", 0.05, deps_s * 0.6)      # emitted: overlaps extract, nests in neither
    t.span("ckpt.stripe", 0.001, ckpt_s, bytes=200_000_000)
    run_end = prep + 60.0
    t.span("job.run", prep + 0.01, run_end)
    p = prep + 0.05
    t.span("python.start", p, p + 0.2, pid=200, rank=rank)
    t.span("import.torch", p + 0.2, p + 0.2 + imports_s, pid=200, rank=rank)
    t.span("import.numpy", p + 0.3, p + 0.9, pid=200, rank=rank, parent="import.torch")
    p += 0.2 + imports_s + arrive_late_s
    done = max(p + 0.5, rendezvous_at or 0.0)
    if first_collective:   # the auto-capture's: init is quick, the first collective waits
        t.span("dist.init", p, p + 0.3, pid=200, rank=rank)
        t.span("dist.first_collective", p + 0.3, done, pid=200, rank=rank, op="barrier")
    else:
        t.span("dist.init", p, done, pid=200, rank=rank)
    t.mark("rendezvous", done, pid=200, rank=rank)
    t.span("ckpt.load", done, done + 1.0, pid=200, rank=rank, bytes_consumed=400_000_000,
           first_byte_s=0.05, stall_s=0.1)
    t.span("train.first_step", done + 1.0, done + 3.0, pid=200, rank=rank)
    t.mark("ready", done + 3.0, pid=200, rank=rank)
    t.mark("ready", done + 3.02)
    t.mark("image.window", done + 3.05, coverage=0.97, precision=0.9, stall_s=0.2,
           store_bytes=120_000_000, prefetch_peer_bytes=80_000_000,
           prefetch_planned_chunks=40, prefetch_already_local=10)
    return t
