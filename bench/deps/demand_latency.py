"""How long one demand read of an environment blob's missing chunk takes: in the
blob server's process (``FillingBlob.read``) and through its FUSE mount (an O_DIRECT
pread of the served ``/blob``, the way EROFS reads it), each with the background fill
idle and running, over bench/deps's link (a namespace whose loopback is shaped to
``--link``, nginx capping each connection at ``--per-connection`` bits/s).

    python bench/deps/demand_latency.py [--chunks 16] [--link 1gbit|none]

Root (a network namespace, nginx, FUSE). Prints the median and p90 per case in ms."""

from __future__ import annotations

import argparse
import functools
import json
import mmap
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bootseer.config import BootseerConfig, CacheConfig, StoreConfig
from bootseer.deps.fill import Fill, FillingBlob, blob_file
from bootseer.mount import fuse
from bootseer.store import open_store
from bootseer.store.client import StoreClient
from bootseer.testing import servers
from bootseer.tree.blob import BlobLayout
from bootseer.tree.build import TreeBuilder, add_directory
from bootseer.tree.reader import TreeReader

CHUNK = 1 << 20
SETTLE_S = 0.3


def build(tmp: Path, files: int) -> tuple[str, str]:
    src = tmp / "src"
    src.mkdir()
    for i in range(files):   # incompressible: the fill's decode does real work
        (src / f"f{i:03d}").write_bytes(os.urandom(CHUNK))
    store = open_store(str(tmp / "store"))
    b = TreeBuilder(store, chunk_size=CHUNK, pack_size=8 * CHUNK)
    add_directory(b, src)
    return b.finish(), str(tmp / "store")


def make(tmp: Path, tree: str, url: str, name: str) -> tuple[BootseerConfig, Fill]:
    config = BootseerConfig(store=StoreConfig(url=url),
                            cache=CacheConfig(dir=str(tmp / name / "cache"), budget_bytes=1 << 32))
    client = StoreClient.of(config)
    toc = TreeReader(client.store(), tree, client.fetcher, client.cache).toc
    layout = BlobLayout(toc)
    d = tmp / name
    (d / "cache" / "erofs").mkdir(parents=True, exist_ok=True)
    (d / "record.json").write_text(json.dumps({"tree": tree}))
    return config, Fill(tree=tree, key="k" * 64, layout=layout.key, record=str(d / "record.json"),
                        blob=str(d / "cache" / "erofs" / f"{layout.key}.blob"))


def slots(config: BootseerConfig, fill: Fill) -> list[int]:
    view = FillingBlob(config, fill, start=False)
    offs = list(view.layout.offsets)
    view.close()
    return offs


def settle(fill_running: bool) -> None:
    """The fill under way (its reader made, its requests on the link) before reading."""
    if fill_running:
        time.sleep(SETTLE_S)


def in_process(config, fill, offsets, *, fill_running: bool) -> list[float]:
    view = FillingBlob(config, fill, start=fill_running)
    out = []
    try:
        settle(fill_running)
        for off in offsets:
            t = time.perf_counter()
            view.read("/blob", 4096, off)
            out.append(time.perf_counter() - t)
    finally:
        view.stop()
        view.close()
    return out


def mounted(tmp: Path, config, fill, offsets, *, fill_running: bool) -> list[float]:
    blobfs = tmp / "blobfs"
    blobfs.mkdir(exist_ok=True)
    h = fuse.mount(functools.partial(FillingBlob, config, fill, start=fill_running), str(blobfs),
                   name="bootseer-demandlat", read_ahead_kb=0)
    buf = mmap.mmap(-1, 4096)
    out = []
    try:
        settle(fill_running)
        fd = os.open(blob_file(str(blobfs)), os.O_RDONLY | os.O_DIRECT)
        try:
            for off in offsets:
                t = time.perf_counter()
                os.preadv(fd, [buf], off)
                out.append(time.perf_counter() - t)
        finally:
            os.close(fd)
    finally:
        h.unmount()
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=256, help="1 MiB files in the tree")
    ap.add_argument("--chunks", type=int, default=24, help="demand reads per case")
    ap.add_argument("--link", default="1gbit", help="the shaped link's rate, or none")
    ap.add_argument("--per-connection", default="250m", help="nginx limit_rate, bits/s")
    a = ap.parse_args(argv)
    if a.link != "none" and not os.environ.get("BS_DEMANDLAT_NETNS"):
        from bootseer.demo.main import shaped_link
        with shaped_link(a.link) as netns:   # everything below runs on the shaped loopback
            return subprocess.run(["nsenter", f"--net=/run/netns/{netns}", sys.executable,
                                   __file__, *argv],
                                  env={**os.environ, "BS_DEMANDLAT_NETNS": netns}).returncode
    from bootseer.demo.link import rate_bits
    rate = str(int(rate_bits(a.per_connection + "bit") / 8))
    with tempfile.TemporaryDirectory(prefix="bs-demandlat-") as t:
        tmp = Path(t)
        tree, root = build(tmp, a.files)
        srv = servers.start_nginx(root, tmp / "nginx", limit_rate=rate)
        try:
            rows = {}
            for n, (where, running) in enumerate([("in-process", False), ("in-process", True),
                                                  ("mount", False), ("mount", True)]):
                config, fill = make(tmp, tree, srv.url, f"n{n}")
                offs = slots(config, fill)
                # from the blob's second half: not what the fill fetches first
                pick = random.Random(n).sample(offs[len(offs) // 2:], a.chunks)
                fn = in_process if where == "in-process" else functools.partial(mounted, tmp)
                s = fn(config, fill, pick, fill_running=running)
                key = f"{where}, fill {'running' if running else 'idle'}"
                rows[key] = s
                q = statistics.quantiles(s, n=10)
                print(f"{key:28s} median {statistics.median(s) * 1e3:6.1f} ms  "
                      f"p90 {q[-1] * 1e3:6.1f} ms  ({len(s)} reads)", flush=True)
        finally:
            srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
