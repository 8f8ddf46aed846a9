"""The demo: build a small real training setup, serve it from a storage host over a shaped
link, start one torchrun job of N nodes (each in its own network namespace, each through
``bootseer run``) three times (conventional, bootseer recording, bootseer prefetching on
fresh nodes), print what each start cost and which node and phase gated it."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bootseer.demo import assets as A
from bootseer.demo import cluster, tables
from bootseer.demo import scenario as S
from bootseer.node.mounts import unmount_under
from bootseer.testing.netns import NetnsError
from bootseer.testing.servers import ServerError

DEFAULT_ASSETS = "/var/tmp/bootseer-demo/assets"


class Progress:
    def __init__(self) -> None:
        self.t0 = time.time()

    def __call__(self, msg: str) -> None:
        print(f"[{time.time() - self.t0:6.1f}s] {msg}", flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=4,
                   help="nodes of the job, each in its own network namespace (default 4)")
    p.add_argument("--rate", default="1gbit",
                   help="the storage host's link, shared by all nodes, tc rate syntax "
                        "(default 1gbit; 'none': not shaped)")
    p.add_argument("--join-timeout", type=int, default=600,
                   help="seconds a node waits at rendezvous for the others (default 600)")
    p.add_argument("--per-connection", default="250m",
                   help="nginx limit_rate per connection in bits (one storage node's "
                        "stream; default 250m = 250 Mbit/s)")
    p.add_argument("--assets", default=DEFAULT_ASSETS,
                   help=f"where the built image, wheelhouse and checkpoint are kept "
                        f"(default {DEFAULT_ASSETS})")
    p.add_argument("--out", default="bootseer-demo",
                   help="directory for the trace and the HTML report (default ./bootseer-demo)")
    p.add_argument("--scratch-size", default="12g", help="tmpfs size for this run's scratch")
    p.add_argument("--only", choices=["baseline", "bootseer"], help=argparse.SUPPRESS)


def _bytes_per_s(bits: str) -> str:
    """'250m' bits/s -> nginx limit_rate in bytes/s."""
    units = {"k": 1e3, "m": 1e6, "g": 1e9}
    n = float(bits[:-1]) * units[bits[-1].lower()] if bits[-1].isalpha() else float(bits)
    return str(int(n / 8))


@contextlib.contextmanager
def scratch_tmpfs(size: str):
    """A fresh tmpfs for stores, caches, environments and podman roots: the root disk
    slows down after repeated GB-scale write/delete cycles and skews the numbers."""
    path = Path(tempfile.mkdtemp(prefix=cluster.scratch_prefix(), dir="/var/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def node_disks():
    """The nodes' own directories (node caches, environments, staged checkpoints) on disk,
    as on a real node: the kernel's file-backed EROFS mounts cannot use files on tmpfs."""
    path = Path(tempfile.mkdtemp(prefix=cluster.scratch_prefix(), dir="/var/tmp"))
    try:
        yield path
    finally:
        unmount_under(str(path))
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def shaped_link(rate: str):
    """A private network namespace whose loopback is shaped to ``rate`` (``none``: no
    namespace, no shaping); the single-process benchmarks' link."""
    if rate == "none":
        yield None
        return
    from bootseer.demo.link import shaped_namespace
    with shaped_namespace(rate) as name:
        yield name


DEMO_STARTS = [S.Start("conventional", ["--baseline"], attempt=0),
               S.Start("bootseer 1st (records)", [], attempt=1),
               S.Start("bootseer 2nd (prefetches)", [], attempt=2)]


def run_starts(args, starts: list[S.Start], *, assets_root: str, train_args: list[str],
               say: Progress) -> list[tuple[str, list[S.NodeResult]]]:
    """Serve the assets from the storage host over its shaped link and run the job of
    ``args.nodes`` nodes once per start; return each start's per-node results. Used by the
    demo and bench/e2e."""
    removed = cluster.remove_leftovers()
    if removed:
        say(f"removed what a killed earlier demo left: {', '.join(removed)}")
    say("building the training setup (cached after the first run)")
    assets = A.build_all(assets_root, say=lambda m: say("  " + m), train_args=train_args,
                         ranks=args.nodes)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    done: list[tuple[str, list[S.NodeResult]]] = []
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(scratch_tmpfs(args.scratch_size))
        nodes_dir = stack.enter_context(node_disks())
        net = stack.enter_context(cluster.demo_cluster(args.nodes, args.rate))
        say(f"network: {args.nodes} nodes ({net.nodes[0].addr}..{net.nodes[-1].addr}), each "
            f"in its own network namespace on one bridge; the storage host "
            f"{net.storage.addr} sends at {args.rate} in all, {args.per_connection}bit/s per "
            f"connection")
        from bootseer.demo.servers import DemoServers
        servers = stack.enter_context(DemoServers(scratch, assets, net.storage,
                                                  _bytes_per_s(args.per_connection), say,
                                                  ranks=args.nodes))
        trace_dir = out / "trace"
        shutil.rmtree(trace_dir, ignore_errors=True)
        base_env = {**servers.client_env, "BOOTSEER_TRACE_LOCATION": str(trace_dir),
                    "BOOTSEER_TRACE_JOB_ID": "demo", "BOOTSEER_STORE_URL": servers.store_url,
                    "OMP_NUM_THREADS": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        run_args = ["--image", servers.image_ref, "--deps", str(assets.requirements),
                    "--prefix", f"{S.NODE_ROOT}/env", "--python", A.IMAGE_PYTHON,
                    "--index-url", servers.index_url, "--ckpt", servers.ckpt_url,
                    "--bind", f"{assets.train_script.parent}:/demo",
                    "-e", f"PYTHONPATH={S.NODE_ROOT}/env/lib/python3.11/site-packages",
                    "-e", f"DEMO_IMPORTS={A.IMPORTS}", "-e", "OMP_NUM_THREADS=1",
                    # gloo's own address: the node's interface on the bridge
                    "-e", "GLOO_SOCKET_IFNAME=eth0"]
        say("resolve the requirements once for the job (bootseer deps key)")
        key = subprocess.run(
            [*net.storage.enter(), sys.executable, "-m", "bootseer", "deps", "key",
             str(assets.requirements), "--prefix", f"{S.NODE_ROOT}/env", "--python",
             A.IMAGE_PYTHON, "--index-url", servers.index_url],
            check=True, capture_output=True, text=True,
            env={**os.environ, **servers.client_env}).stdout.strip()
        run_args += ["--deps-key", key]
        job = S.Job(nodes=net.nodes, python="python3", script="/demo/train.py",
                    script_args=train_args, join_timeout_s=args.join_timeout)
        stack.callback(_stop_all_kept, nodes_dir, starts, say)
        for i, start in enumerate(starts):
            say(f"start '{start.name}': {args.nodes} nodes start one torchrun job ...")
            launched = S.launch_nodes(start, job, work=nodes_dir, run_args=run_args,
                                      base_env=base_env)
            try:
                results = S.wait_nodes(launched, timeout_s=args.join_timeout + 600)
            finally:   # Ctrl-C: each node's bootseer run unmounts and stops its job
                S.stop_all(launched)
            # zygotes kept on these nodes serve a later start of the same node set; those
            # no later start uses are stopped now (by PID), not left to idle out
            later = {s.node_set for s in starts[i + 1:]}
            if start.node_set not in later and S.stop_kept(nodes_dir, start.node_set):
                say("  kept zygotes stopped: no later start on these nodes")
            left = S.sweep_nodes(job, spare=S.kept_pids(nodes_dir, start.node_set))
            if left:
                say("  processes left after the start, killed: "
                    + "; ".join(f"{k}: {', '.join(v)}" for k, v in left.items()))
            if start.node_set not in later:
                S.cleanup_nodes(nodes_dir, start)
            S.keep_logs(results, out / "logs" / start.name)
            ready = [r.ready_s for r in results if r.ready_s is not None]
            say(f"  {len(ready)}/{len(results)} nodes ready"
                + (f", slowest at {max(ready):.1f} s" if ready else ""))
            waits = S.rendezvous_wait(results)
            if waits:
                say("  waited at rendezvous for the last node: "
                    + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(waits.items())))
            problem = S.explain_failure(results)
            if problem:
                say(f"  {problem}")
                for r in results:
                    if r.rc not in (0, None):
                        say(f"  {r.node} exited {r.rc}: " + "\n      ".join(S.log_tail(r)))
            done.append((start.name, results))
    return done


def _stop_all_kept(nodes_dir: Path, starts: list[S.Start], say: Progress) -> None:
    """At the end (or on Ctrl-C): every zygote kept on any node set, stopped by its PID,
    so nothing is left running."""
    stopped = sum(S.stop_kept(nodes_dir, n) for n in {s.node_set for s in starts})
    if stopped:
        say(f"stopped {stopped} kept zygote(s)")


def run_demo(args) -> int:
    say = Progress()
    if os.geteuid() != 0:
        print("bootseer demo: needs root (FUSE mounts, network namespaces, containers)",
              file=sys.stderr)
        return 1
    # SIGTERM unwinds like Ctrl-C: every node is stopped, every namespace and mount removed.
    signal.signal(signal.SIGTERM, _interrupt)
    starts = DEMO_STARTS
    if args.only == "baseline":
        starts = starts[:1]
    elif args.only == "bootseer":
        starts = starts[1:]
    try:
        done = run_starts(args, starts, assets_root=args.assets, train_args=A.TRAIN_ARGS,
                          say=say)
    except (subprocess.CalledProcessError, NetnsError, ServerError) as e:
        # what the demo could not set up (its servers, its network): one line, no traceback
        print(f"bootseer demo: error: {e}", file=sys.stderr)
        return 1
    print()
    print(tables.render(done, _trace_events(Path(args.out).resolve() / "trace")))
    print()
    _report(Path(args.out).resolve() / "trace", Path(args.out).resolve(), say)
    return 0 if all(r.rc == 0 for _, rs in done for r in rs) else 1


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _trace_events(trace_dir: Path) -> list[dict] | None:
    """The run's trace events (None: no trace), for where each start's hot set came from."""
    from bootseer.errors import BootseerError
    from bootseer.report import load as trace_load
    try:
        return trace_load.load(trace_dir).events
    except (BootseerError, OSError):
        return None


def _report(trace_dir: Path, out: Path, say) -> None:
    if not trace_dir.exists():
        return
    html = out / "report.html"
    proc = subprocess.run([sys.executable, "-m", "bootseer", "report", str(trace_dir),
                           "--html", str(html)], capture_output=True, text=True)
    if proc.returncode == 0:
        print(proc.stdout)
        say(f"HTML report: {html}")
    else:
        say(f"report failed: {proc.stderr.strip()[-500:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bootseer demo", description=__doc__)
    add_arguments(p)
    return run_demo(p.parse_args(argv))
