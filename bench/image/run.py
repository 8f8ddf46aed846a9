"""bench/image: time to READY of a training image, pulled vs lazily mounted, on one node.

    .venv/bin/python bench/image/run.py [--rate 1gbit] [--reps 1] [--quick]

The image is built offline once (kept in the assets directory): the demo's layers (a Debian
bookworm rootfs from the apt mirror, Python 3.11, torch CPU) plus a third layer with numpy,
the application code and model-like data files (--data-mib in all, incompressible), about
1.6 GB unpacked. It is pushed to the Debian docker-registry inside a network namespace
whose loopback is shaped to --rate, and converted into a bootseer store in the same
registry. The workload imports torch, its distributed checkpoint module, numpy and the app,
reads a few MiB from each data file (a tokenizer table, an embedding slice), then signals
ready. Every variant runs on a fresh node (empty node cache, fresh podman root):

  (1) pull + run        bootseer run --baseline: podman pull + unpack, then podman run
  (2) lazy              bootseer run, no profile yet (records and publishes one at READY)
  (3) lazy + prefetch   bootseer run on a fresh node, prefetching the recorded hot blocks
  (4) fully local       (1)'s container run alone, the image already unpacked on disk
  (3f) lazy + prefetch, FUSE view   (3) with BOOTSEER_MOUNT_BACKEND=fuse: the Python FUSE
                        tree view instead of the kernel's EROFS (the path before issue #14)
(2) and (3) take the kernel path (EROFS on a data blob) where the kernel has it.
Goals (issue #4): (3) <= 0.25 x (1); (3) <= 0.5 x (2); coverage >= 95%, precision >= 80%;
(2) never slower than (1). Issue #14: (3) <= 1.15 x (4).
  (5) containerd + overlayfs, (6) containerd + bootseer snapshotter: see containerd_rows.py
  (issue #15: (6) <= 0.25 x (5) and <= 1.2 x (3)); --no-containerd skips them.
--quick runs (2), (3) and (3f) only (the lazy paths side by side, about a minute once the
image is converted): for checking a change to the kernel or FUSE path, not for the table.
Each lazy row also says how many chunks a read waited for from the store (demand_chunks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(1, str(ROOT))   # tests.support.cri: the CRI client (test-only, not in the wheel)

from bootseer.demo import assets as A  # noqa: E402
from bootseer.demo.main import DEFAULT_ASSETS, scratch_tmpfs, shaped_link  # noqa: E402
from bootseer.testing import servers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import containerd_rows  # noqa: E402

CTD_PULL, CTD_LAZY = "(5) containerd + overlayfs", "(6) containerd + bootseer"

WORKLOAD = ("import os, sys; sys.path.insert(0, '/opt/app'); "
            "import torch, torch.nn, torch.distributed.checkpoint, numpy, app.main; "
            "app.main.warm_up(); "
            "open(os.environ['BOOTSEER_READY_FILE'], 'w').close(); print('READY')")
DATA_FILES = 4
FUSE_ROW = "(3f) lazy + prefetch, FUSE view"
APP = '''"""The benchmark's training application: at start-up it reads the parts of its data
files a first step needs (a header, a vocabulary table, a slice of each shard)."""
import glob
import os

import numpy

DATA = "/opt/app/data"


def warm_up():
    total = 0
    for path in sorted(glob.glob(os.path.join(DATA, "*.bin"))):
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            for offset in (0, size // 3, size - (4 << 20)):
                f.seek(offset)
                total += numpy.frombuffer(f.read(2 << 20), dtype=numpy.uint8).size
    return total
'''


def build_bench_image(assets, data_mib: int, say) -> Path:
    """The demo image plus a layer with numpy, the app and ``data_mib`` of data files."""
    out = Path(assets.root) / f"bench-image-{data_mib}m.oci.tar"
    if out.exists():
        return out
    work = Path(assets.root) / "bench-image.tmp"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    layer = work / "layer"
    site = layer / "usr/local/lib/python3.11/dist-packages"
    say(f"build the benchmark image: demo image + numpy + app + {data_mib} MiB of data")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile",
                    "--disable-pip-version-check", "--no-index", "--find-links",
                    str(assets.index / "wheels"), "--target", str(site), "numpy"], check=True)
    (layer / "opt/app/app").mkdir(parents=True)
    (layer / "opt/app/app/__init__.py").write_text("")
    (layer / "opt/app/app/main.py").write_text(APP)
    (layer / "opt/app/data").mkdir(parents=True)
    per = data_mib // DATA_FILES
    for i in range(DATA_FILES):
        with open(layer / f"opt/app/data/shard-{i:02d}.bin", "wb") as f:
            for _ in range(per):
                f.write(os.urandom(1 << 20))
    store = f"/tmp/bsbi-{os.getpid()}"
    b = ["buildah", "--root", f"{store}/r", "--runroot", f"{store}/rr", "--storage-driver", "vfs"]
    try:
        ctr = subprocess.run([*b, "from", f"oci-archive:{assets.image_archive}:demo/train:latest"],
                             check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run([*b, "copy", ctr, f"{layer}/", "/"], check=True, capture_output=True)
        subprocess.run([*b, "commit", "-q", ctr, "bench-train"], check=True,
                       capture_output=True)
        tmp = out.with_suffix(".tmp")
        subprocess.run([*b, "push", "-q", "bench-train", f"oci-archive:{tmp}:bench/train:latest"],
                       check=True)
        tmp.rename(out)
    finally:
        subprocess.run(["umount", "-R", "-l", f"{store}/r"], capture_output=True)
        subprocess.run(["rm", "-rf", store, str(work)], check=True)
    return out


def run_variant(name: str, flags: list[str], *, scratch: Path, netns: str | None, ref: str,
                store: str, attempt: int, env_extra: dict | None = None) -> dict:
    node = scratch / "nodes" / f"{attempt}"
    node.mkdir(parents=True)
    summary = node / "summary.json"
    env = {**os.environ, "BOOTSEER_STORE_URL": store, "BOOTSEER_CACHE_DIR": str(node / "cache"),
           "BOOTSEER_TRACE_LOCATION": str(scratch / "trace"), "BOOTSEER_TRACE_JOB_ID": "img",
           "BOOTSEER_TRACE_ATTEMPT": str(attempt), "BOOTSEER_TRACE_NODE": "node0",
           **(env_extra or {})}
    argv = [sys.executable, "-m", "bootseer", "run", "--image", ref, *flags, "--summary",
            str(summary), "--", "python3", "-c", WORKLOAD]
    if netns:
        argv = ["nsenter", f"--net=/run/netns/{netns}", *argv]
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    if p.returncode != 0 or not summary.exists():
        raise SystemExit(f"{name} failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    s = json.loads(summary.read_text())
    row = {"ready_s": s["ready_s"]}
    prep = s["phases"].get("startup.prepare")
    if prep:
        row["prepare_s"] = prep["end"]
    if "--baseline" in flags and prep:
        row["local_run_s"] = s["ready_s"] - prep["end"]
    lazy = s["phases"].get("image.lazy") or {}
    if lazy.get("mount"):
        row["mount"] = lazy["mount"]   # erofs-fuse-blob, erofs-local or fuse
    for f in (scratch / "trace" / "img" / str(attempt)).glob("*.jsonl"):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e.get("phase") == "image.window":
                row.update({k: e["attrs"].get(k) for k in
                            ("coverage", "precision", "stall_s", "demand_chunks", "store_bytes",
                             "store_requests", "read_bytes", "window_s", "prefetch_seconds")
                            if e["attrs"].get(k) is not None})
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--reps", type=int, default=1, help="repetitions of each variant (median)")
    p.add_argument("--assets", default=DEFAULT_ASSETS)
    p.add_argument("--data-mib", type=int, default=400,
                   help="model-like data files in the image (MiB, default 400)")
    p.add_argument("--out", default=str(ROOT / "bench/results/image.json"))
    p.add_argument("--no-containerd", action="store_true",
                   help="skip the containerd rows (5) and (6)")
    p.add_argument("--quick", action="store_true",
                   help="only (2), (3) and (3f): no pull, no containerd rows")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench/image needs root (network namespace, FUSE, podman)", file=sys.stderr)
        return 1
    assets = A.build_all(args.assets, say=lambda m: print(m, flush=True))
    archive = build_bench_image(assets, args.data_mib, say=lambda m: print(m, flush=True))
    results: dict[str, list[dict]] = {}
    with scratch_tmpfs("12g") as scratch, shaped_link(args.rate) as netns:
        reg = servers.start_registry(scratch / "registry", scratch / "registry-run", netns=netns)
        try:
            ns = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
            ref = f"127.0.0.1:{reg.port}/bench/train:latest"
            subprocess.run([*ns, "skopeo", "copy", "-q", "--dest-tls-verify=false",
                            f"oci-archive:{archive}:bench/train:latest",
                            f"docker://{ref}"], check=True)
            store = f"oci://127.0.0.1:{reg.port}/bootseer"
            subprocess.run([*ns, sys.executable, "-m", "bootseer", "image", "convert", ref,
                            "--to", store], check=True, stdout=subprocess.DEVNULL)
            print(f"image {ref}, link {args.rate}; variants on fresh nodes:", flush=True)
            attempt = 0
            for rep in range(args.reps):
                for name, flags, env in [
                        ("(1) pull + run", ["--baseline"], {}),
                        ("(2) lazy", ["--no-prefetch"], {}),
                        ("(3) lazy + prefetch", [], {}),
                        (FUSE_ROW, [], {"BOOTSEER_MOUNT_BACKEND": "fuse"})]:
                    if args.quick and name == "(1) pull + run":
                        continue
                    attempt += 1
                    row = run_variant(name, flags, scratch=scratch, netns=netns, ref=ref,
                                      store=store, attempt=attempt, env_extra=env)
                    results.setdefault(name, []).append(row)
                    if "local_run_s" in row:
                        results.setdefault("(4) fully local", []).append(
                            {"ready_s": row["local_run_s"]})
                    print(f"  {name:34} ready {row['ready_s']:6.2f} s  {row.get('mount', '')} "
                          + "  ".join(f"{k} {v:.3g}" for k, v in row.items()
                                      if k != "ready_s" and isinstance(v, (int, float))),
                          flush=True)
            if not (args.no_containerd or args.quick):   # issue #15: the same image through the CRI
                print("containerd (CRI, as the kubelet starts a pod), fresh nodes:", flush=True)
                for k, row in containerd_rows.run(
                        scratch=scratch, netns=netns, ref=ref,
                        registry_host=f"127.0.0.1:{reg.port}", store=store,
                        argv=["python3", "-c", WORKLOAD],
                        say=lambda m: print(m, flush=True)).items():
                    results.setdefault(k, []).append(row)
        finally:
            reg.stop()
    med = {k: statistics.median(r["ready_s"] for r in rows) for k, rows in results.items()}
    r3 = results["(3) lazy + prefetch"][-1]
    if args.quick:
        print(f"\n{'variant':34} {'ready s':>8}")
        for k in ["(2) lazy", "(3) lazy + prefetch", FUSE_ROW]:
            print(f"{k:34} {med[k]:8.2f}")
        print(f"(3)/(3f) {med['(3) lazy + prefetch'] / med[FUSE_ROW]:.2f}, coverage "
              f"{r3.get('coverage') or 0:.1%}, demand chunks {r3.get('demand_chunks')}")
        return 0
    print(f"\n{'variant':34} {'ready s':>8} {'x (1)':>7}")
    for k in ["(1) pull + run", "(2) lazy", "(3) lazy + prefetch", "(4) fully local",
              FUSE_ROW]:
        print(f"{k:34} {med[k]:8.2f} {med[k] / med['(1) pull + run']:7.2f}")
    if not args.no_containerd:
        for k in (CTD_PULL, CTD_LAZY):
            print(f"{k:34} {med[k]:8.2f} {med[k] / med['(1) pull + run']:7.2f}")
        print(f"goals (containerd): (6)/(5) {med[CTD_LAZY] / med[CTD_PULL]:.2f} (<= 0.25), "
              f"(6)/(3) {med[CTD_LAZY] / med['(3) lazy + prefetch']:.2f} (<= 1.2)")
    print(f"goals: (3)/(1) {med['(3) lazy + prefetch'] / med['(1) pull + run']:.2f} (<= 0.25), "
          f"(3)/(2) {med['(3) lazy + prefetch'] / med['(2) lazy']:.2f} (<= 0.5), "
          f"(3)/(4) {med['(3) lazy + prefetch'] / med['(4) fully local']:.2f} (<= 1.15; "
          f"FUSE view {med[FUSE_ROW] / med['(4) fully local']:.2f}), "
          f"coverage {r3.get('coverage') or 0:.1%} (>= 95%), "
          # the kernel path's precision is its pre-read's (the job's page-cache hits reach
          # no Python): the FUSE view measures the profile's
          f"precision (3f) {results[FUSE_ROW][-1].get('precision') or 0:.1%} (>= 80%), "
          f"(2)/(1) {med['(2) lazy'] / med['(1) pull + run']:.2f} (<= 1)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
