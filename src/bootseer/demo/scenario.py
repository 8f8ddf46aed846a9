"""The demo's job: N node-processes resuming the demo training job, started three times.

Each node is a ``bootseer run`` in its own mount namespace (``unshare``), so every node has
private copies of the same paths (``/opt/bsdemo`` for the environment, its own node cache):
fresh nodes on one machine. Nodes reach the servers (registry, package index, checkpoint
and store over HTTP) inside a private network namespace whose loopback is shaped to the
link rate, so they share one link as nodes share a storage network.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

NODE_ROOT = "/opt/bsdemo"  # same path on every node, private per node (bind in a mount ns)


@dataclass
class Start:
    name: str
    flags: list[str]
    attempt: int
    fresh_nodes: bool = True


@dataclass
class NodeResult:
    node: str
    rc: int
    summary: dict
    log: Path

    @property
    def ready_s(self) -> float | None:
        return self.summary.get("ready_s")

    def phase_s(self, name: str) -> float | None:
        p = self.summary.get("phases", {}).get(name)
        return None if p is None else p["end"] - p["start"]


def node_command(*, node_dir: Path, netns: str | None, run_args: list[str], env: dict[str, str],
                 cmd: list[str]) -> list[str]:
    """The argv that starts one node: (nsenter into the shaped network), a private mount
    namespace with this node's directory bound at NODE_ROOT, then ``bootseer run``."""
    bootseer = [sys.executable, "-m", "bootseer", "run", *run_args, "--", *cmd]
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    script = (f"mount --bind {shlex.quote(str(node_dir / 'opt'))} {NODE_ROOT} && "
              f"exec env {exports} {shlex.join(bootseer)}")
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    if netns:
        argv = ["nsenter", f"--net=/run/netns/{netns}", *argv]
    return argv


def start_nodes(start: Start, *, nodes: int, work: Path, netns: str | None,
                run_args: list[str], cmd: list[str], base_env: dict[str, str],
                timeout_s: float = 900) -> list[NodeResult]:
    """Launch ``nodes`` node-processes at once; wait for all; collect their summaries."""
    Path(NODE_ROOT).mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(nodes):
        name = f"node{i}"
        node_dir = work / "nodes" / (start.name if start.fresh_nodes else "shared") / name
        (node_dir / "opt").mkdir(parents=True, exist_ok=True)
        summary = work / "summaries" / start.name / f"{name}.json"
        summary.parent.mkdir(parents=True, exist_ok=True)
        log = summary.with_suffix(".log")
        env = {**base_env, "BOOTSEER_CACHE_DIR": str(node_dir / "cache"),
               "BOOTSEER_TRACE_NODE": name, "BOOTSEER_TRACE_ATTEMPT": str(start.attempt),
               "RANK": str(i)}
        argv = node_command(node_dir=node_dir, netns=netns, env=env, cmd=cmd,
                            run_args=[*run_args, *start.flags, "--summary", str(summary)])
        out = open(log, "wb")
        procs.append((name, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True), summary, log, out))
    results = []
    deadline = time.time() + timeout_s
    for name, proc, summary, log, out in procs:
        try:
            rc = proc.wait(max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 15)
            rc = proc.wait()
        out.close()
        data = json.loads(summary.read_text()) if summary.exists() else {}
        results.append(NodeResult(name, rc, data, log))
    return results


def cleanup_nodes(work: Path, start: Start) -> None:
    shutil.rmtree(work / "nodes" / start.name, ignore_errors=True)


def keep_logs(results: list[NodeResult], dest: Path) -> None:
    """Copy each node's log and summary out of the scratch tmpfs (removed at the end)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    for r in results:
        for src in (r.log, r.log.with_suffix(".json")):
            if src.exists():
                shutil.copy2(src, dest / src.name)
