"""The demo's job: one ``torchrun`` job of N nodes, each node a ``bootseer run`` on its own
host (network namespace), started several times.

Every node runs what a user would run on a cluster node::

    bootseer run ... -- python3 -m torch.distributed.run --nnodes N --nproc-per-node 1 \\
        --rdzv-backend c10d --rdzv-endpoint <node0>:29400 ... train.py

in its own network namespace (its own address on the bridge) and its own mount namespace
(``unshare``), so every node has private copies of the same paths (``/opt/bsdemo`` for the
environment, its own node cache): fresh nodes on one machine. Node 0 hosts the rendezvous.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from bootseer.node import proc as procs
from bootseer.run import warmkeep
from bootseer.testing.netns import Host, processes_in

NODE_ROOT = "/opt/bsdemo"  # same path on every node, private per node (bind in a mount ns)
RDZV_PORT = 29400


@dataclass
class Start:
    name: str
    flags: list[str]
    attempt: int | None
    """None: ``bootseer run --attempt auto`` counts this job's starts itself."""
    fresh_nodes: bool = True
    nodes: str | None = None
    """A named set of nodes several starts share (their caches, environment and warm
    directory, so zygotes one start keeps serve the next); None: fresh nodes of its own, or
    the shared ones (``fresh_nodes`` False)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of every node's ``bootseer run`` (e.g. ``BOOTSEER_WARM_KEEP_S``)."""
    rdzv: str | None = None
    """The rendezvous id's suffix (None: from the name); starts that share it run the same
    command line, as a job's restarts do."""

    @property
    def rdzv_id(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "-", self.rdzv or self.name).strip("-")

    @property
    def node_set(self) -> str:
        """The name of the node directories this start runs on."""
        return self.nodes or (self.name if self.fresh_nodes else "shared")


@dataclass
class Job:
    """The torchrun job every node runs; ``python`` and ``script`` as the job sees them (in
    the image, or on the host)."""
    nodes: list[Host]
    python: str
    script: str
    script_args: list[str]
    job_id: str = "demo"
    join_timeout_s: int = 600   # how long a node waits at rendezvous for the others

    def command(self, index: int, rdzv_id: str) -> list[str]:
        node = self.nodes[index]
        conf = (f"join_timeout={self.join_timeout_s},read_timeout={self.join_timeout_s},"
                # node 0 hosts the rendezvous store: say so (its address is not the
                # machine's host name, which torch would compare against).
                f"is_host={1 if index == 0 else 0}")
        return [self.python, "-m", "torch.distributed.run", "--nnodes", str(len(self.nodes)),
                "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{self.nodes[0].addr}:{RDZV_PORT}",
                "--rdzv-id", f"{self.job_id}-{rdzv_id}", "--rdzv-conf", conf,
                "--local-addr", node.addr, "--max-restarts", "0", "--monitor-interval", "0.5",
                self.script, *self.script_args]


@dataclass
class NodeResult:
    node: str
    rc: int | None
    """Exit status of the node's ``bootseer run``; None: the node was never started."""
    summary: dict
    log: Path

    @property
    def ready_s(self) -> float | None:
        return self.summary.get("ready_s")

    def phase_s(self, name: str) -> float | None:
        p = self.summary.get("phases", {}).get(name)
        return None if p is None else p["end"] - p["start"]

    @property
    def joined(self) -> bool:
        """Whether the node's command (torchrun, which joins the rendezvous) ever ran."""
        return "job.run" in self.summary.get("phases", {})

    @property
    def timed_out_at_rendezvous(self) -> bool:
        return self.log.exists() and "RendezvousTimeoutError" in self.log.read_text(
            errors="replace")


@dataclass
class Launched:
    host: Host
    proc: subprocess.Popen | None
    summary: Path
    log: Path
    out: BinaryIO | None = field(default=None, repr=False)   # the log, open while it runs

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the node's whole process group (what a dying machine does to its job)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)


def node_command(*, node: Host, node_dir: Path, run_args: list[str], env: dict[str, str],
                 cmd: list[str], bootseer: list[str] | None = None) -> list[str]:
    """The argv that starts one node: enter its network namespace, a private mount namespace
    with this node's directory bound at NODE_ROOT, then ``bootseer run``."""
    bootseer = bootseer or [sys.executable, "-m", "bootseer"]
    run = [*bootseer, "run", *run_args, "--", *cmd]
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    script = (f"mkdir -p {NODE_ROOT} && "
              f"mount --bind {shlex.quote(str(node_dir / 'opt'))} {NODE_ROOT} && "
              f"exec env {exports} {shlex.join(run)}")
    return [*node.enter(), "unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def launch_nodes(start: Start, job: Job, *, work: Path, run_args: list[str],
                 base_env: dict[str, str], hold: AbstractSet[str] = frozenset()
                 ) -> list[Launched]:
    """Start every node's ``bootseer run`` at once (each in its own process group); the nodes
    named in ``hold`` are not started (a machine that never comes up)."""
    launched = []
    for i, host in enumerate(job.nodes):
        node_dir = work / "nodes" / start.node_set / host.name
        (node_dir / "opt").mkdir(parents=True, exist_ok=True)
        summary = work / "summaries" / start.name / f"{host.name}.json"
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.unlink(missing_ok=True)
        log = summary.with_suffix(".log")
        if host.name in hold:
            log.write_text("")
            launched.append(Launched(host, None, summary, log))
            continue
        env = {**base_env, "BOOTSEER_CACHE_DIR": str(node_dir / "cache"),
               "BOOTSEER_TRACE_NODE": host.name,
               # per node, kept across the starts of its node set: a --warm start finds
               # the module list (and kept zygote) of the previous one on this node (the
               # nodes share the machine's /tmp)
               "BOOTSEER_WARM_DIR": str(warm_dir(work, start.node_set) / host.name),
               **start.env}
        if start.attempt is not None:
            env["BOOTSEER_TRACE_ATTEMPT"] = str(start.attempt)
        argv = node_command(node=host, node_dir=node_dir, env=env,
                            cmd=job.command(i, start.rdzv_id),
                            run_args=[*run_args, *start.flags, "--summary", str(summary)])
        out = open(log, "wb")
        launched.append(Launched(host, procs.spawn(   # dies with the demo (proc.py)
            subprocess.Popen, argv, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=procs.preexec()),
            summary, log, out))
    return launched


def wait_nodes(launched: list[Launched], timeout_s: float = 900) -> list[NodeResult]:
    """Wait for every node; a node still running at the deadline is stopped (SIGTERM to its
    process group, then SIGKILL). Collect the summaries."""
    deadline = time.time() + timeout_s
    results = []
    for n in launched:
        rc = None
        if n.proc is not None:
            try:
                rc = n.proc.wait(max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                rc = stop(n.proc)
            if n.out is not None:
                n.out.close()
        data = json.loads(n.summary.read_text()) if n.summary.exists() else {}
        results.append(NodeResult(n.host.name, rc, data, n.log))
    return results


def stop_all(launched: list[Launched], grace_s: float = 15) -> None:
    """SIGTERM every node still running at once (each cleans up: unmounts, stops its job),
    then SIGKILL those still there after ``grace_s``."""
    running = [n.proc for n in launched if n.proc is not None and n.proc.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in running:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        for proc in running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        running = [p for p in running if p.poll() is None]
        if not running:
            return


def stop(proc: subprocess.Popen, grace_s: float = 15) -> int:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def sweep_nodes(job: Job, grace_s: float = 5, spare: AbstractSet[int] = frozenset()
                ) -> dict[str, list[str]]:
    """Kill (by PID) whatever is still running on a node after its start, once processes
    still exiting had ``grace_s`` to go; return each node's survivors (their commands).
    ``spare``: PIDs kept on purpose (kept zygotes a later start of the same nodes uses)."""
    def left_in(host: Host) -> list[int]:
        return [pid for pid in processes_in(host.netns) if pid not in spare]
    deadline = time.monotonic() + grace_s
    while any(left_in(h) for h in job.nodes) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {}
    for host in job.nodes:
        pids = left_in(host)
        if pids:
            left[host.name] = [_command(pid) for pid in pids]
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for pid in pids:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                end = time.monotonic() + grace_s
                while (pids := left_in(host)) and time.monotonic() < end:
                    time.sleep(0.1)
                if not pids:
                    break
    return left


def warm_dir(work: Path, node_set: str) -> Path:
    """The warm directories (``warm.dir``) of a node set's nodes, one per node below."""
    return work / "nodes" / "warm" / node_set


def kept_zygotes(work: Path, node_set: str) -> list[dict]:
    """The records (``kept.json``: PID, state directory) of the zygotes kept on a node
    set's nodes."""
    found = []
    for path in sorted(warm_dir(work, node_set).rglob(warmkeep.RECORD)):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


def kept_pids(work: Path, node_set: str) -> set[int]:
    """The PIDs of a node set's kept zygotes, the holders of their images and all their
    descendants."""
    roots = {int(r.get(k, 0)) for r in kept_zygotes(work, node_set)
             for k in ("pid", "holder")} - {0}
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def stop_kept(work: Path, node_set: str) -> int:
    """Stop a node set's kept zygotes by their PIDs (each record's own ``stop``: the PID
    must still be that zygote's); how many were still running."""
    running = 0
    for record in kept_zygotes(work, node_set):
        state = str(record.get("state", ""))
        running += _runs(int(record.get("pid", 0)), state)
        warmkeep.stop(record)
    return running


def _runs(pid: int, marker: str) -> bool:
    """Whether ``pid`` is running a command that names ``marker`` (not a reused PID)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return bool(marker) and marker.encode() in f.read()
    except OSError:
        return False


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return f"pid {pid}"


def explain_failure(results: list[NodeResult]) -> str | None:
    """One line on why a start did not get every node ready (None: all ready), naming the
    nodes that never joined the rendezvous when the others timed out waiting."""
    if all(r.ready_s is not None for r in results):
        return None
    waiting = [r.node for r in results if r.timed_out_at_rendezvous]
    missing = [r.node if r.rc is None else f"{r.node} ({_status(r.rc)})"
               for r in results if not r.joined and not r.timed_out_at_rendezvous]
    if waiting and missing:
        return (f"rendezvous timed out on {', '.join(waiting)}: "
                f"{', '.join(missing)} never joined")
    failed = [f"{r.node} ({_status(r.rc)})" for r in results if r.ready_s is None]
    return "not ready: " + ", ".join(failed)


def _status(rc: int | None) -> str:
    if rc is None:
        return "never started"
    if rc < 0 or rc > 128:
        sig = -rc if rc < 0 else rc - 128
        return f"killed by {signal.Signals(sig).name}" if sig in signal.valid_signals() \
            else f"exit {rc}"
    return f"exit {rc}"


def rendezvous_wait(results: list[NodeResult]) -> dict[str, float]:
    """Per node: how long its job waited at rendezvous for the last node to arrive (the
    nodes share one clock here), from when each node's command started."""
    arrivals = {r.node: r.summary["t0"] + r.summary["phases"]["job.run"]["start"]
                for r in results if r.joined and "t0" in r.summary}
    if not arrivals:
        return {}
    last = max(arrivals.values())
    return {node: last - t for node, t in arrivals.items()}


def cleanup_nodes(work: Path, start: Start) -> None:
    """Remove a start's node directories (once no later start uses its node set)."""
    shutil.rmtree(work / "nodes" / start.node_set, ignore_errors=True)


def keep_logs(results: list[NodeResult], dest: Path) -> None:
    """Copy each node's log and summary out of the scratch tmpfs (removed at the end)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    for r in results:
        for src in (r.log, r.log.with_suffix(".json")):
            if src.exists():
                shutil.copy2(src, dest / src.name)


def log_tail(r: NodeResult, lines: int = 8) -> list[str]:
    if not r.log.exists():
        return []
    return [ln for ln in r.log.read_text(errors="replace").splitlines() if ln.strip()][-lines:]
