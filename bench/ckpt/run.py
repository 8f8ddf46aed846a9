"""Striped checkpoint reads, the five variants of issue #6, one command:

    .venv/bin/python bench/ckpt/run.py [--size 2GiB] [--link 2gbit] [--per-conn 31250k]
    .venv/bin/python bench/ckpt/run.py --variants 3 --size 512MiB     (quick: one row)

A torch DCP checkpoint of ``--size`` bytes is generated on a tmpfs the benchmark mounts,
served by nginx (``limit_rate`` per connection = one storage node's stream) inside a
network namespace whose loopback is shaped to ``--link``. The whole load runs inside that
namespace. Variants (each a full ``dcp.load`` into preallocated tensors, verified):

  1 mount-single      our FUSE mount, one buffer, one request in flight (the fuse-dfs baseline)
  2 fsspec-http       torch's FsspecReader over fsspec's default HTTP file
  3 mount-striped     our FUSE mount, striped engine, served as ``bootseer ckpt mount``
                      serves it here (devfuse where the kernel has passthrough; then
                      "3m" is the same through mfusepy); no plan prefetch: read-ahead only
  4 dcp-reader        StripedDCPReader (no mount)
  5 mount-prefetched  (3) after plan prefetch started --lead seconds earlier (second run:
                      staging is warm, i.e. also the "second load from local cache" row)
  6 safetensors       a sharded safetensors checkpoint (written by the benchmark, 4 shards)
                      loaded as safetensors does it (mmap of the file, header, a copy per
                      tensor) through the striped mount, against ``cat`` of the same bytes
                      through the same mount ("6s")
  7 staged re-read    every file staged and complete, then read again (1 MiB reads)
                      through a fresh mount served by mfusepy and by devfuse (passthrough),
                      twice each, alternating; "local" reads the staging files directly

Everything started is stopped by PID; mounts, the tmpfs and the namespace are removed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "src"))
sys.path.insert(0, str(HERE.parents[1]))   # bench/outdir.py

import outdir  # noqa: E402

from bootseer.config import parse_size  # noqa: E402


def remote_view(url, cfg, mode, stats_path, staging):
    """The mount's view, built in the spawned FUSE server (so: module level, picklable);
    a fresh staging directory per variant, so no variant starts warm."""
    from bootseer.ckpt.engine import Engine
    from bootseer.ckpt.listing import RemoteDir
    from bootseer.ckpt.view import RemoteDirView
    return RemoteDirView(RemoteDir(url), Engine(cfg.ckpt, cfg.fetch, staging=staging),
                         mode=mode, stats_path=stats_path)

def shaped_namespace(name: str, link: str) -> None:
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    # the link: loopback of the namespace shaped with a token bucket (about 1 ms of burst)
    subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root",
                    "tbf", "rate", link, "burst", "1mb", "latency", "50ms"], check=True)


def outer(args) -> int:
    ns = f"bsckpt{os.getpid()}"
    scratch = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    # DCP + safetensors + two staging copies (each variant's is removed after it)
    tmpfs_bytes = int(args.size * 4.4) + (256 << 20)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs_bytes}", "tmpfs", str(scratch)],
                   check=True)
    try:
        shaped_namespace(ns, args.link)
        cmd = ["ip", "netns", "exec", ns, sys.executable, str(HERE), "--inner",
               "--scratch", str(scratch), "--size", str(args.size), "--per-conn", args.per_conn,
               "--lead", str(args.lead), "--link", args.link, "--variants", args.variants]
        return subprocess.run(cmd).returncode
    finally:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        subprocess.run(["umount", "-l", str(scratch)], capture_output=True)
        os.rmdir(scratch)


def make_checkpoint(d: Path, size: int):
    import torch
    import torch.distributed.checkpoint as dcp
    n = max(1, size // (64 << 20))
    per = size // n // 4
    g = torch.Generator().manual_seed(0)
    state = {f"layer{i}": torch.rand(per, generator=g) for i in range(n)}
    dcp.save(state, checkpoint_id=str(d))
    return state


def make_safetensors(d: Path, size: int, shards: int = 4) -> dict:
    """The safetensors format written directly (8-byte header length, JSON header, raw
    tensor bytes), so the benchmark needs no extra package."""
    import struct

    import torch
    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    per_tensor = 16 << 20
    want = {}
    for s in range(shards):
        n = max(1, size // shards // per_tensor)
        tensors = {f"s{s}.t{i}": torch.rand(per_tensor // 4, generator=g) for i in range(n)}
        header, off = {}, 0
        for k, t in tensors.items():
            header[k] = {"dtype": "F32", "shape": list(t.shape),
                         "data_offsets": [off, off + t.numel() * 4]}
            off += t.numel() * 4
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(d / f"model-{s:05d}.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for t in tensors.values():
                f.write(t.numpy().tobytes())
        want.update(tensors)
    return want


def load_safetensors_mmap(path: Path) -> dict:
    """What ``safetensors.torch.load_file`` does: mmap, parse the header, copy each tensor."""
    import mmap
    import struct

    import torch
    out = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        n = struct.unpack("<Q", m[:8])[0]
        header = json.loads(bytes(m[8:8 + n]))
        base = 8 + n
        for k, v in header.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            out[k] = torch.frombuffer(bytearray(m[base + a:base + b]), dtype=torch.float32)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vmhwm(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def read_files(paths) -> int:
    """Read every file with 1 MiB reads (as ``cat`` does); bytes read."""
    buf, total = bytearray(1 << 20), 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


def staged_reread(url: str, cfg, scratch: Path, rows: list, link_bps: float) -> None:
    """(7) Every file staged and complete on the node, then read again through a fresh
    checkpoint mount: mfusepy (Python answers each 1 MiB read from the staging copy) and
    devfuse (the kernel reads the staging copy through passthrough), twice each,
    alternating, against reading the staging files directly (the ceiling)."""
    import dataclasses

    from bootseer.ckpt.engine import Engine
    from bootseer.ckpt.listing import RemoteDir
    from bootseer.ckpt.mount import mount_checkpoint
    from bootseer.ckpt.staging import node_staging_dir
    staging = node_staging_dir(cfg)
    with Engine(cfg.ckpt, cfg.fetch, staging=str(staging)) as e:
        for source in RemoteDir(url).walk().values():
            f, off = e.file(source), 0
            while off < source.size:   # sequential: every stripe lands in staging
                off += len(f.read(off, 64 << 20))
            if not f.staged.complete:
                raise SystemExit(f"{source.url} was not staged completely")
    staged = [p for p in staging.iterdir() if p.is_file() and len(p.name) == 32]
    staged_bytes = sum(p.stat().st_size for p in staged)
    runs = [("local", None)] + [(b, b) for _ in range(2) for b in ("mfusepy", "devfuse")]
    for label, backend in runs:
        subprocess.run(["sync"])
        t = time.monotonic()
        python_bytes = None
        if backend is None:
            nbytes = read_files(staged)
            dt = time.monotonic() - t
        else:
            c = dataclasses.replace(cfg, ckpt=dataclasses.replace(cfg.ckpt, fuse=backend))
            mp = scratch / f"mnt-7-{len(rows)}"
            mp.mkdir()
            report = scratch / f"stats-7-{len(rows)}.json"
            with mount_checkpoint(url + "/", str(mp), c, prefetch=False,
                                  stats_path=str(report)):
                t = time.monotonic()
                nbytes = read_files(sorted(p for p in mp.rglob("*") if p.is_file()))
                dt = time.monotonic() - t
            python_bytes = json.loads(report.read_text())["bytes_consumed"]
        if nbytes != staged_bytes:
            raise SystemExit(f"(7) {label}: read {nbytes} bytes, staged {staged_bytes}")
        row = {"variant": f"7 staged re-read, {label}", "seconds": round(dt, 2),
               "GB/s": round(nbytes / dt / 1e9, 3),
               "link_%": round(100 * nbytes / dt / link_bps, 1)}
        if python_bytes is not None:
            row["python_MB"] = round(python_bytes / 1e6)   # bytes handed over by Python
        rows.append(row)
        print(json.dumps(row), flush=True)
    shutil.rmtree(staging, ignore_errors=True)


def inner(args) -> int:
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed.checkpoint as dcp

    from bootseer.ckpt.dcp import StripedDCPReader
    from bootseer.ckpt.engine import Engine
    from bootseer.config import BootseerConfig
    from bootseer.mount.fuse import mount
    from bootseer.testing.servers import start_nginx

    scratch = Path(args.scratch)
    ck = scratch / "dcp"
    t0 = time.monotonic()
    state = make_checkpoint(ck, args.size)
    nbytes = sum(p.stat().st_size for p in ck.iterdir())
    print(f"# checkpoint: {nbytes / 1e9:.2f} GB DCP, {len(state)} tensors, made in "
          f"{time.monotonic() - t0:.0f}s; link {args.link}, per connection {args.per_conn}B/s",
          flush=True)
    server = start_nginx(ck, scratch / "nginx", limit_rate=args.per_conn)
    cfg = BootseerConfig.from_env(overrides={"cache": {"dir": str(scratch / "cache/blobs")}})
    link_bps = parse_size(args.link.replace("bit", ""), "link") / 8
    rows = []

    def check(out):
        for k in state:
            if not torch.equal(out[k], state[k]):
                raise SystemExit(f"tensor {k} differs")

    def load(label, fn, hwm_pid=None):
        out = {k: torch.empty_like(v) for k, v in state.items()}
        server_cpu = cpu_seconds(hwm_pid) if hwm_pid else 0.0
        own = os.times()
        t = time.monotonic()
        fn(out)
        dt = time.monotonic() - t
        own_cpu = sum(os.times()[:2]) - sum(own[:2])
        check(out)
        row = {"variant": label, "seconds": round(dt, 2), "GB/s": round(nbytes / dt / 1e9, 3),
               "link_%": round(100 * nbytes / dt / link_bps, 1),
               "loader_cpu_s": round(own_cpu, 2)}   # the process calling dcp.load
        if hwm_pid:
            row["fuse_peak_rss_MB"] = round(vmhwm(hwm_pid) / 1e6)
            row["fuse_cpu_s"] = round(cpu_seconds(hwm_pid) - server_cpu, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del out

    def via_mount(label, mode, backend=None):
        """A fresh mount (and staging) of the checkpoint served by ``backend``: ``None``
        is the server ``bootseer ckpt mount`` picks here (devfuse where the kernel has
        passthrough, else mfusepy)."""
        from bootseer.mount.choose import What, choose
        from bootseer.mount.serve import serve_files
        c = cfg if backend is None else dataclasses.replace(
            cfg, ckpt=dataclasses.replace(cfg.ckpt, fuse=backend))
        chosen = choose(c, What.FILES).value
        tag = label.split()[0]
        mp = scratch / f"mnt-{tag}"
        mp.mkdir()
        report = scratch / f"stats-{tag}.json"
        staging = scratch / f"staging-{tag}"
        build = functools.partial(remote_view, server.url, cfg, mode, str(report), str(staging))
        with serve_files(c, build, str(mp), name=f"ckpt-{tag}") as h:
            load(label, lambda out: dcp.load(out, checkpoint_id=str(mp)), h.pid)
        shutil.rmtree(staging, ignore_errors=True)
        s = json.loads(report.read_text())
        rows[-1].update(fuse=chosen,
                        stripe_mem_peak_MB=round(s["memory_peak_bytes"] / 1e6),
                        budget_MB=round(s["memory_budget_bytes"] / 1e6),
                        fetched_over_consumed=round(s["bytes_fetched"] /
                                                    max(1, s["bytes_consumed"]), 3),
                        first_byte_s=round(s["first_byte_s"] or 0, 3),
                        stalls=s["stalls"], stall_s=round(s["stall_s"], 2))
        print(json.dumps(rows[-1]), flush=True)
        return rows[-1]["fuse"]

    wanted = set(args.variants.split(","))
    try:
        if "1" in wanted:
            via_mount("1 mount-single", "single")
        if "2" in wanted:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
            load("2 fsspec-http", lambda out: dcp.load(
                out, storage_reader=FsspecReader(server.url)))
        if "3" in wanted:
            # what `ckpt mount` serves here, and mfusepy beside it when that is devfuse
            if via_mount("3 mount-striped", "striped") == "devfuse":
                via_mount("3m mount-striped, mfusepy", "striped", backend="mfusepy")
        if "4" in wanted:
            with Engine(cfg.ckpt, cfg.fetch, staging=str(scratch / "staging-4")) as e:
                load("4 dcp-reader", lambda out: dcp.load(
                    out, storage_reader=StripedDCPReader(server.url, e)))
            shutil.rmtree(scratch / "staging-4", ignore_errors=True)
        if "5" in wanted:
            from bootseer.ckpt.mount import mount_checkpoint
            for run in ("5 mount-prefetched", "5b second load (staging warm)"):
                mp = scratch / f"mnt-5-{len(rows)}"
                mp.mkdir()
                with mount_checkpoint(server.url + "/", str(mp), cfg, prefetch=True) as h:
                    if run.startswith("5 "):
                        time.sleep(args.lead)
                    load(run, lambda out, mp=mp: dcp.load(out, checkpoint_id=str(mp)), h.pid)
            from bootseer.ckpt.staging import node_staging_dir
            shutil.rmtree(node_staging_dir(cfg), ignore_errors=True)  # the staging of (5)
        if "6" in wanted:
            st = scratch / "st"
            want = make_safetensors(st, args.size)
            st_bytes = sum(p.stat().st_size for p in st.iterdir())
            st_server = start_nginx(st, scratch / "nginx-st", limit_rate=args.per_conn)
            try:
                for label, how in (("6s cat via mount", "cat"),
                                   ("6 safetensors via mount", "mmap")):
                    mp = scratch / f"mnt-6{how}"
                    mp.mkdir()

                    build = functools.partial(remote_view, st_server.url, cfg, "striped", None,
                                              str(scratch / f"staging-6{how}"))
                    with mount(build, str(mp), name="ckpt-st"):
                        dt = 0.0
                        for p in sorted(mp.iterdir()):
                            t = time.monotonic()
                            if how == "cat":
                                with open(p, "rb") as f:
                                    while f.read(1 << 20):
                                        pass
                                dt += time.monotonic() - t
                                continue
                            got = load_safetensors_mmap(p)
                            dt += time.monotonic() - t  # checked per file, outside the clock
                            bad = [k for k in got if not torch.equal(got[k], want[k])]
                            if bad:
                                raise SystemExit(f"safetensors tensors differ: {bad[:3]}")
                            del got
                    shutil.rmtree(scratch / f"staging-6{how}", ignore_errors=True)
                    row = {"variant": label, "seconds": round(dt, 2),
                           "GB/s": round(st_bytes / dt / 1e9, 3),
                           "link_%": round(100 * st_bytes / dt / link_bps, 1)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                st_server.stop()
        if "7" in wanted:
            staged_reread(server.url, cfg, scratch, rows, link_bps)
    finally:
        server.stop()
    base = next((r["seconds"] for r in rows if r["variant"].startswith("1 ")), None)
    print("\n| variant | s | GB/s | % of link | x vs (1) | stripe memory peak / budget MB "
          "| fetched/consumed | server | reader stalls s | CPU s loader / FUSE |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        x = f"{base / r['seconds']:.1f}" if base else "-"
        mem = (f"{r['stripe_mem_peak_MB']} / {r['budget_MB']}" if "budget_MB" in r else "-")
        cpu = f"{r['loader_cpu_s']} / {r['fuse_cpu_s']}" if "fuse_cpu_s" in r else \
            r.get("loader_cpu_s", "-")
        print(f"| {r['variant']} | {r['seconds']} | {r['GB/s']} | {r['link_%']} | {x} | {mem} "
              f"| {r.get('fetched_over_consumed', '-')} | {r.get('fuse', '-')} "
              f"| {r.get('stall_s', '-')} | {cpu} |")
    outdir.write_json("ckpt.json", {"args": {k: v for k, v in vars(args).items()
                                             if k not in ("inner", "scratch")}, "rows": rows})
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", type=lambda s: parse_size(s, "--size"), default=parse_size("2GiB"))
    ap.add_argument("--link", default="2gbit", help="tc rate of the shaped link")
    ap.add_argument("--per-conn", default="31250k", help="nginx limit_rate (bytes/s)")
    ap.add_argument("--lead", type=float, default=10.0, help="prefetch head start, seconds")
    ap.add_argument("--variants", default="1,2,3,4,5,6,7")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scratch", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return inner(args)
    if os.geteuid() != 0:
        print("bench/ckpt needs root (network namespace, tc, tmpfs, FUSE)", file=sys.stderr)
        return 2
    return outer(args)


if __name__ == "__main__":
    sys.exit(main())
