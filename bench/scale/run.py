"""bench/scale: a set fetched by N nodes at once, with and without peers.

One storage host (the Debian docker-registry as the bootseer store) whose link is shaped to
``--rate`` (1 Gbit/s) for everything it sends, and N node network namespaces on one bridge
(node-to-node traffic at bridge speed), each with its own address and node cache. Two sets,
each published as it is in use (with its torrent, docs/peers.md):

* ``image``: an image's hot set (``--mib`` of incompressible chunks, 1 MiB each), as the
  recording node publishes it with the profile;
* ``env``: an environment snapshot (``--mib`` in small, compressible files and large
  incompressible ones), as ``deps`` publishes it, fetched into the node cache the way a
  restore through peers does (the extract after it is the same with or without peers);
* ``ckpt``: a checkpoint (``--mib`` in four incompressible shards) on nginx on the storage
  host, staged by every node's checkpoint engine as the mount's prefetch does; its
  manifest and torrent published beforehand (a restart: a node of an earlier start made
  them);
* ``ckpt-new``: the same files with a new mtime each round (a new checkpoint: the first
  node of the job to load it is the maker, the others wait for its manifest).

All nodes of a round wait at a start line, then fetch the set: from the origin only, or
with peers (libtorrent among the job's nodes). Per set, N and mode: origin egress (bytes
the storage host sent, from its interface counters, and as a multiple of the set), and time
to ready (the slowest node's fetch from the start line, and as a multiple of N = 1 in the
same mode), and the nodes' CPU seconds (per second of the round: near the machine's cores,
the round was bound by the CPU, not the link). Needs root (network namespaces, tc, a
scratch tmpfs it mounts and removes).

    .venv/bin/python bench/scale/run.py [--nodes 1,2,4,8] [--mib 64] \
        [--sets image,env,ckpt,ckpt-new]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "bsscale"


def _storage_tx(netns: str) -> int:
    out = subprocess.run(["ip", "-n", netns, "-s", "-j", "link", "show", "eth0"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["stats64"]["tx"]["bytes"]


def _env() -> dict:
    return {**os.environ, "BOOTSEER_STORE_INSECURE": "1", "PYTHONUNBUFFERED": "1"}


# -- in a namespace -----------------------------------------------------------------------------
def build(store_url: str, mib: int, out: str) -> None:
    """Runs on the storage host: both sets, published with their torrents."""
    from bootseer.config import BootseerConfig
    from bootseer.deps import snapshot
    from bootseer.store import open_store
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.build import TreeBuilder, add_directory
    from bootseer.tree.peers import publish_for_profile
    from bootseer.tree.reader import TreeReader
    scratch = tempfile.mkdtemp(prefix="bsscale-build-")
    config = BootseerConfig.from_env(overrides={
        "store": {"url": store_url}, "cache": {"dir": os.path.join(scratch, "cache")},
        "peers": {"mode": "on"}})
    store = open_store(store_url, config)
    spec = {}
    try:
        with tempfile.TemporaryDirectory() as src:
            for i in range(mib // 4):
                Path(src, f"lib{i:03d}.so").write_bytes(os.urandom(4 << 20))
            b = TreeBuilder(store, chunk_size=1 << 20, pack_size=64 << 20)
            add_directory(b, src)
            tree = b.finish()
        with Fetcher(config.fetch) as f:
            chunks = TreeReader(store, tree, f).all_chunks()
        profile = {"v": 1, "kind": "bootseer.profile", "tree": tree,
                   "chunks": [[c[0]] for c in chunks]}
        publish_for_profile(config, store, profile)       # the recording node's part
        spec["image"] = {"tree": tree, "set_bytes": sum(c[3] for c in chunks),
                         "profile": profile}
        with tempfile.TemporaryDirectory() as env:
            _environment(Path(env), mib)
            tree = snapshot.publish(store, "/opt/bsscale-env", "sha256:" + "5" * 64,
                                    root=env, config=config)
        with Fetcher(config.fetch) as f:
            chunks = TreeReader(store, tree, f).all_chunks()
        spec["env"] = {"tree": tree, "set_bytes": sum(c[3] for c in chunks),
                       "profile": {"chunks": [[c[0]] for c in chunks]}}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    Path(out).write_text(json.dumps(spec))


def _environment(root: Path, mib: int) -> None:
    """A Python environment's shape: a quarter of the bytes in small text-like modules
    (2-32 KiB, compressible), the rest in large incompressible libraries (8 MiB)."""
    import random
    rnd = random.Random(16)
    words = [os.urandom(4).hex() for _ in range(512)]
    small, i = 0, 0
    while small < (mib << 20) // 4:
        size = rnd.randint(2 << 10, 32 << 10)
        text = " ".join(rnd.choice(words) for _ in range(size // 9)).encode()[:size]
        d = root / "lib" / f"pkg{i // 50:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i:05d}.py").write_bytes(text)
        small, i = small + len(text), i + 1
    for k in range(max(1, (mib - mib // 4) // 8)):
        (root / "lib" / f"native{k:02d}.so").write_bytes(os.urandom(8 << 20))


def _cpu_s() -> float:
    """This node's CPU seconds so far (every thread: libtorrent's, the fetcher's)."""
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _checkpoint(root: Path, mib: int) -> None:
    """Four shards of incompressible bytes (a data-parallel job's replicas read them all)."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(4):
        (root / f"shard{i}.distcp").write_bytes(os.urandom((mib << 20) // 4))


def _ckpt_config(args, mode: str, nodes: int):
    from bootseer.config import BootseerConfig
    return BootseerConfig.from_env(overrides={
        "store": {"url": args.store}, "cache": {"dir": args.cache},
        "trace": {"job_id": args.job, "node": args.name},
        "peers": {"mode": mode, "nodes": nodes,
                  "min_set_bytes": 0, "interface": args.addr, "stall_s": 10.0}})


def ckpt_node(args, mode: str, nodes: int, go: str | None = None) -> dict:
    """A node's checkpoint load: the plan's stripes staged, through the peers or not."""
    from bootseer.ckpt.engine import Engine
    from bootseer.ckpt.listing import RemoteDir
    from bootseer.ckpt.prefetch import start_plan
    from bootseer.ckpt.staging import node_staging_dir
    config = _ckpt_config(args, mode, nodes)
    engine = Engine(config.ckpt, config.fetch, staging=str(node_staging_dir(config)),
                    store_url=args.store)
    remote = RemoteDir(args.ckpt)
    remote.walk()
    if go:
        Path(args.out + ".ready").touch()
        while not os.path.exists(go):
            time.sleep(0.005)
    t0, c0 = time.monotonic(), _cpu_s()
    prefetch, _ = start_plan(engine, remote, config=config)
    prefetch.join()
    figures = prefetch.peer_figures
    return {"ready_s": time.monotonic() - t0, "cpu_s": _cpu_s() - c0,
            "peer_bytes": figures.get("peer_bytes", 0),
            "origin_bytes": engine.fetcher.counters()["bytes"],
            "peers_role": figures.get("peers_role"), "failed": prefetch.failed,
            "complete": all(engine.file(s).staged.complete for s in remote.walk().values())}


def node(args) -> None:
    """Runs on a node: at the start line, fetch the set; write the figures; seed until told
    to stop."""
    import logging

    from bootseer.config import BootseerConfig
    from bootseer.peers import share_for
    from bootseer.store import open_store
    from bootseer.store.cache import NodeCache
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.prefetch import Prefetcher
    from bootseer.tree.reader import TreeReader
    logging.basicConfig(level=os.environ.get("BENCH_LOG", "WARNING"),
                        format=f"{args.name}: %(levelname)s %(name)s: %(message)s")
    if args.set.startswith("ckpt"):
        stats = ckpt_node(args, "auto" if args.peers else "off", args.n, go=args.go)
        Path(args.out).write_text(json.dumps(stats, default=str))
        _seed_until(args.stop)
        return
    spec = json.loads(Path(args.spec).read_text())[args.set]
    config = BootseerConfig.from_env(overrides={
        "store": {"url": args.store}, "cache": {"dir": args.cache},
        "trace": {"job_id": args.job, "node": args.name},
        "peers": {"mode": "auto" if args.peers else "off", "nodes": args.n,
                  "min_set_bytes": 0, "interface": args.addr, "stall_s": 10.0}})
    store = open_store(args.store, config)
    reader = TreeReader(store, spec["tree"], Fetcher(config.fetch), NodeCache(config.cache))
    share = share_for(config, store)   # announces this node: part of joining the job
    Path(args.out + ".ready").touch()
    while not os.path.exists(args.go):
        time.sleep(0.005)
    t0, c0 = time.monotonic(), _cpu_s()
    pre = Prefetcher(reader, spec["profile"], peers=share).start()
    pre.wait()
    stats = {**pre.stats, "ready_s": time.monotonic() - t0, "cpu_s": _cpu_s() - c0}
    Path(args.out).write_text(json.dumps(stats, default=str))
    _seed_until(args.stop)


def _seed_until(stop: str) -> None:
    deadline = time.monotonic() + 300
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.1)   # peers still fetch from this node


# -- the driver ---------------------------------------------------------------------------------
def run_round(storage, hosts, store_url, spec_path, scratch: Path, which: str, n: int,
              peers: bool, ckpt_url: str = ""):
    job = f"scale{os.getpid()}-{which}-{n}-{'p2p' if peers else 'origin'}"
    work = scratch / job
    work.mkdir()
    stop, go = work / "stop", work / "go"
    procs = []
    for i, h in enumerate(hosts[:n]):
        argv = [*h.enter(), sys.executable, __file__, "node", "--store", store_url,
                "--spec", str(spec_path), "--set", which, "--ckpt", ckpt_url,
                "--cache", str(work / f"n{i}" / "cache"), "--job", job, "--name", f"n{i}",
                "--n", str(n), "--addr", h.addr, "--out", str(work / f"n{i}.json"),
                "--stop", str(stop), "--go", str(go)]
        if peers:
            argv.append("--peers")
        procs.append(subprocess.Popen(argv, env=_env()))
    outs = [work / f"n{i}.json" for i in range(n)]
    try:
        _wait_for([Path(f"{o}.ready") for o in outs], procs, n)
        tx0 = _storage_tx(storage.netns)
        go.touch()                     # every node starts now
        _wait_for(outs, procs, n)
        tx = _storage_tx(storage.netns) - tx0
    finally:
        stop.touch()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    stats = [json.loads(o.read_text()) for o in outs]
    shutil.rmtree(work, ignore_errors=True)   # the round's caches: only one round on the tmpfs
    if any(st.get("complete") is False or st.get("failed") for st in stats):
        raise SystemExit(f"error: a node of round N={n} did not stage the whole checkpoint")
    for i, st in enumerate(stats):
        print(f"    n{i}: ready {st['ready_s']:.2f}s, role {st.get('peers_role') or '-'}, "
              f"from peers {st['peer_bytes'] / 2**20:.0f} MiB, "
              f"from origin {st['origin_bytes'] / 2**20:.0f} MiB", flush=True)
    return {"set": which, "n": n, "peers": peers, "egress": tx,
            "ready_s": max(s["ready_s"] for s in stats),
            "cpu_s": sum(s["cpu_s"] for s in stats),
            "peer_bytes": sum(s["peer_bytes"] for s in stats),
            "origin_bytes": sum(s["origin_bytes"] for s in stats)}


def _wait_for(paths, procs, n: int) -> None:
    deadline = time.monotonic() + 600
    while not all(p.exists() for p in paths):
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            raise SystemExit(f"error: a node of round N={n} failed (see its output above)")
        time.sleep(0.02)


def _uptime() -> str:
    """The load averages (1, 5, 15 min): the machine is shared, the numbers are noisy."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    b = sub.add_parser("build")
    b.add_argument("--store"), b.add_argument("--mib", type=int), b.add_argument("--out")
    nd = sub.add_parser("node")
    for opt in ("--store", "--spec", "--set", "--cache", "--job", "--name", "--addr", "--out",
                "--stop", "--go", "--ckpt"):
        nd.add_argument(opt)
    nd.add_argument("--n", type=int)
    nd.add_argument("--peers", action="store_true")
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--mib", type=int, default=64,
                    help="size of each set (8 nodes' fetch, verification and libtorrent "
                         "share the machine's cores: keep it moderate)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--tmpfs-gib", type=int, default=6,
                    help="size of the scratch tmpfs (the registry, nginx and one round's "
                         "node caches; default 6)")
    ap.add_argument("--modes", default="origin,p2p", help="origin, p2p or both")
    ap.add_argument("--sets", default="image,env,ckpt,ckpt-new",
                    help="comma-separated: image, env, ckpt, ckpt-new")
    pub = sub.add_parser("publish-ckpt")
    for opt in ("--store", "--cache", "--ckpt", "--addr"):
        pub.add_argument(opt)
    args = ap.parse_args()
    if args.cmd == "build":
        return build(args.store, args.mib, args.out)
    if args.cmd == "node":
        return node(args)
    if args.cmd == "publish-ckpt":   # an earlier start's node: the manifest and torrent
        args.job, args.name = f"publish{os.getpid()}", "publisher"
        stats = ckpt_node(args, "on", 1)
        return None if stats["peers_role"] == "maker" else sys.exit(f"not published: {stats}")
    if os.geteuid() != 0:
        raise SystemExit("error: bench/scale needs root (network namespaces, tc)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from bootseer.testing import servers
    from bootseer.testing.netns import Network, remove_leftovers
    remove_leftovers(PREFIX)
    counts = [int(x) for x in args.nodes.split(",")]
    sets = args.sets.split(",")
    # scratch on a tmpfs of its own: the root disk slows down after GB-scale write/delete
    # cycles, and creating a file there costs a millisecond or more under load
    scratch = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-{os.getpid()}-", dir="/var/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.tmpfs_gib}g,mode=0700",
                    f"{PREFIX}-scratch", str(scratch)], check=True)
    rows = []
    load_before = _uptime()
    print(f"load average before: {load_before}", flush=True)
    try:
        with Network(PREFIX, subnet="10.98.0") as net:
            storage = net.add_host("storage", egress_rate=args.rate)
            hosts = [net.add_host(f"node{i}") for i in range(max(counts))]
            reg = servers.start_registry(scratch / "registry", scratch / "registry-run",
                                         netns=storage.netns, host=storage.addr)
            www = scratch / "www"
            _checkpoint(www, args.mib)
            web = servers.start_nginx(www, scratch / "nginx", netns=storage.netns,
                                      host=storage.addr)
            try:
                store_url = f"oci://{storage.addr}:{reg.port}/bootseer"
                ckpt_url = f"http://{storage.addr}:{web.port}/"
                spec = scratch / "spec.json"
                subprocess.run([*storage.enter(), sys.executable, __file__, "build", "--store",
                                store_url, "--mib", str(args.mib), "--out", str(spec)],
                               check=True, env=_env())
                set_bytes = {k: v["set_bytes"] for k, v in json.loads(spec.read_text()).items()}
                set_bytes["ckpt"] = set_bytes["ckpt-new"] = sum(
                    f.stat().st_size for f in www.iterdir())
                if "ckpt" in sets:
                    subprocess.run([*storage.enter(), sys.executable, __file__, "publish-ckpt",
                                    "--store", store_url, "--ckpt", ckpt_url, "--addr",
                                    storage.addr, "--cache", str(scratch / "publisher" / "cache")],
                                   check=True, env=_env())
                for which in sets:
                    for n in counts:
                        for peers in [m == "p2p" for m in args.modes.split(",")]:
                            if which == "ckpt-new":   # a new version of every shard
                                stamp = time.time() + len(rows)
                                for f in www.iterdir():
                                    os.utime(f, (stamp, stamp))
                            rows.append(run_round(storage, hosts, store_url, spec, scratch,
                                                  which, n, peers, ckpt_url))
                            r = rows[-1]
                            print(f"  {which} N={n} {'p2p   ' if peers else 'origin'} egress "
                                  f"{r['egress'] / set_bytes[which]:.2f}x the set, "
                                  f"ready {r['ready_s']:.2f}s", flush=True)
            finally:
                web.stop()
                reg.stop()
    finally:
        subprocess.run(["umount", str(scratch)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = _uptime()
    name = "scale.json" if args.rate == "1gbit" else f"scale-{args.rate}.json"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # bench/outdir.py
    import outdir
    outdir.write_json(name, {"set_bytes": set_bytes, "rate": args.rate, "rows": rows,
                             "load_before": load_before, "load_after": load_after})
    base = {(r["set"], r["peers"]): r["ready_s"] for r in rows if r["n"] == counts[0]}
    print(f"\nsets of {args.mib} MiB (stored: "
          + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in set_bytes.items())
          + f"), storage link {args.rate}, nodes start at once; load average "
          f"{load_before} before, {load_after} after\n")
    print(f"| set | N | mode | origin egress (MiB) | egress / set | time to ready (s) "
          f"| ready / N={counts[0]} | nodes' CPU (s) | CPU / ready |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['set']} | {r['n']} | {'p2p' if r['peers'] else 'origin'} "
              f"| {r['egress'] / 2**20:.0f} | {r['egress'] / set_bytes[r['set']]:.2f} "
              f"| {r['ready_s']:.2f} | {r['ready_s'] / base[(r['set'], r['peers'])]:.2f} "
              f"| {r['cpu_s']:.2f} | {r['cpu_s'] / r['ready_s']:.2f} |")
    print(f"\n(CPU / ready: the nodes' CPU seconds per second of the round; this machine has "
          f"{os.cpu_count()} cores: near that, the round was bound by the CPU, not the link)")


if __name__ == "__main__":
    main()
