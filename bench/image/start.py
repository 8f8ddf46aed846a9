"""bench/image/start.py: time from `bootseer run --image` to the job's first instruction,
against the time to fetch the image's metadata (issue #25: <= 0.3 s beyond it).

    .venv/bin/python bench/image/start.py [--files 30000] [--reps 5] [--quick]

The image is a lazy tree of --files small files in directories of 100 plus a static
busybox (built once into a local store under bench/results/start-assets); the job is
``busybox sh -c 'echo > /ctl/go'``, whose write to a FIFO bound into the container is the
first thing it does: the bench reads the FIFO and takes that instant. Each rep runs on a
fresh node (an empty node cache: the TOC and the metadata image are fetched) and on a
node that ran it before (both in its cache); ``metadata fetch`` is the store's time to
hand over the TOC and the metadata image (what a start cannot do without; the rest is
bootseer's own start). --quick: 3000 files, 2 reps, for checking a change.
Needs root, FUSE and EROFS (the kernel path); writes bench/results/image-start.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(1, str(ROOT / "bench"))   # outdir.py

import outdir  # noqa: E402

from bootseer.store import open_store  # noqa: E402
from bootseer.tree import format as fmt  # noqa: E402
from bootseer.tree.build import TreeBuilder  # noqa: E402

GOAL_S = 0.3
BUSYBOX = shutil.which("busybox") or "/usr/bin/busybox"


def build(store_dir: Path, files: int) -> str:
    """The tree (kept: built once per file count)."""
    mark = store_dir / f"tree-v2-{files}"
    if mark.exists():
        return mark.read_text().strip()
    b = TreeBuilder(open_store(str(store_dir)))
    for d in ("/bin", "/ctl", "/dev", "/proc", "/sys", "/tmp", "/etc", "/data"):
        b.add_dir(d)
    b.add_file("/bin/busybox", Path(BUSYBOX).read_bytes(), mode=0o755)
    for tool in ("sh", "env", "cat", "true"):   # the chroot runtime starts the job with env
        b.add_symlink(f"/bin/{tool}", "busybox")
    for d in range(files // 100):
        b.add_dir(f"/data/d{d:04d}")
        for i in range(100):
            b.add_file(f"/data/d{d:04d}/f{i:03d}.py", b"print(%d)\n" % (d * 100 + i))
    tree = b.finish()
    mark.write_text(tree)
    return tree


def metadata_fetch_s(store_dir: Path, tree: str) -> float:
    """The store's time to hand over the TOC and the stored metadata image (read only:
    decoding the TOC is the start's own work)."""
    store = open_store(str(store_dir))
    t = time.monotonic()
    blob = store.read(tree)
    took = time.monotonic() - t
    image = fmt.decode(blob, tree).erofs["images"]["tree"]
    t = time.monotonic()
    store.read(image)
    return took + time.monotonic() - t


def first_instruction_s(store_dir: Path, tree: str, cache: Path, work: Path) -> float:
    """`bootseer run` started to the job's write to the FIFO."""
    ctl = work / "ctl"
    shutil.rmtree(ctl, ignore_errors=True)
    ctl.mkdir(parents=True)
    os.mkfifo(ctl / "go")
    got: dict[str, float] = {}

    def wait() -> None:
        with open(ctl / "go", "rb") as f:
            f.read(1)
            got["t"] = time.monotonic()
    reader = threading.Thread(target=wait, daemon=True)
    reader.start()
    env = {**{k: v for k, v in os.environ.items() if k != "BOOTSEER_BENCH_RESULTS"},
           "BOOTSEER_CACHE_DIR": str(cache), "BOOTSEER_MOUNT_BACKEND": "erofs",
           "PYTHONPATH": str(ROOT / "src")}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "bootseer", "-q", "run", "--image", tree,
                        "--store", str(store_dir), "--runtime", "chroot", "--no-prefetch",
                        "--bind", f"{ctl}:/ctl:rw", "--", "/bin/sh", "-c", "echo > /ctl/go"],
                       env=env, capture_output=True, text=True, timeout=120)
    reader.join(5)
    if r.returncode != 0 or "t" not in got:
        raise SystemExit(f"bootseer run failed ({r.returncode}): {r.stderr[-2000:]}")
    return got["t"] - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=30000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.files, a.reps = 3000, 2
    assets = outdir.path("start-assets", is_dir=True)
    tree = build(assets / "store", a.files)
    work = assets / "work"
    fresh, warm, meta = [], [], []
    for _ in range(a.reps):
        cache = work / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        meta.append(metadata_fetch_s(assets / "store", tree))
        fresh.append(first_instruction_s(assets / "store", tree, cache, work))
        warm.append(first_instruction_s(assets / "store", tree, cache, work))
    m = statistics.median(meta)
    doc = {"files": a.files, "reps": a.reps, "metadata_fetch_s": round(m, 4),
           "fresh_s": round(statistics.median(fresh), 3),
           "warm_s": round(statistics.median(warm), 3), "goal_beyond_fetch_s": GOAL_S}
    for row in ("fresh", "warm"):
        beyond = doc[f"{row}_s"] - m
        doc[f"{row}_beyond_fetch_s"] = round(beyond, 3)
        print(f"{row:5} node: run to first instruction {doc[f'{row}_s']:.3f} s, metadata fetch "
              f"{m:.3f} s: {beyond:.3f} s beyond it (goal <= {GOAL_S} s: "
              f"{'met' if beyond <= GOAL_S else 'NOT met'}; median of {a.reps})")
    outdir.write_json("image-start-quick.json" if a.quick else "image-start.json", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
