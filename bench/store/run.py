"""Loopback throughput of the store backends' HTTP path (bootseer.store.http) against a
real nginx and a real docker-registry: one GET versus N threads of 8 MiB range reads,
``read()`` (a fresh bytes object per part) versus ``read_into()`` (one preallocated
buffer), and the registry's chunked upload. No shaping: this measures the client's
ceiling on this machine (the shaped-link goals are bench/fetch's).

    .venv/bin/python bench/store/run.py [--size-mib 512] [--threads 4 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from bootseer.store import open_store, sha256_digest
from bootseer.testing.servers import start_nginx, start_registry

MiB = 1 << 20
PART = 8 * MiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=512, help="blob size, MiB")
    ap.add_argument("--threads", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--reps", type=int, default=3, help="best of this many runs")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    size = args.size_mib * MiB
    rows: list[dict] = []

    def row(name: str, mib_s: float) -> None:
        rows.append({"variant": name, "MiB_s": round(mib_s)})
        print(f"{name:40s} {mib_s:8.0f} MiB/s", flush=True)

    def run(name, fn):
        best = 0.0
        for _ in range(args.reps):
            t = time.perf_counter()
            fn()
            best = max(best, size / (time.perf_counter() - t) / MiB)
        row(name, best)

    def parallel(n, fn):
        with ThreadPoolExecutor(n) as ex:
            list(ex.map(fn, range(0, size, PART)))

    work = tempfile.mkdtemp(prefix="bench-store-")
    servers = []
    try:
        local = open_store(f"{work}/s")
        data = os.urandom(size)
        d = sha256_digest(data)
        local.write(d, data)
        del data
        buf = memoryview(bytearray(size))
        nginx = start_nginx(f"{work}/s", f"{work}/nginx")
        servers.append(nginx)
        h = open_store(nginx.url)
        run("nginx: 1 stream (one GET)", lambda: h.read(d))
        for n in args.threads:
            run(f"nginx: {n} threads x 8 MiB read()",
                lambda n=n: parallel(n, lambda s: h.read(d, s, s + PART)))
            run(f"nginx: {n} threads x 8 MiB read_into()",
                lambda n=n: parallel(n, lambda s: h.read_into(d, s, buf[s:s + PART])))
        run("local dir: read() (page cache)", lambda: local.read(d))
        reg = start_registry(f"{work}/reg", f"{work}/regw")
        servers.append(reg)
        o = open_store(f"oci://127.0.0.1:{reg.port}/bench/store")
        t = time.perf_counter()
        with open(local.path(d), "rb") as f:
            o.write(d, f)
        row("registry: chunked upload (64 MiB PATCH)", size / (time.perf_counter() - t) / MiB)
        run("registry: 1 stream (one GET)", lambda: o.read(d))
        for n in args.threads:
            run(f"registry: {n} threads x 8 MiB read_into()",
                lambda n=n: parallel(n, lambda s: o.read_into(d, s, buf[s:s + PART])))
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        import outdir  # bench/outdir.py: the --json file's directory is made
        outdir.write_json(os.path.abspath(args.json), {"size_bytes": size, "rows": rows})


if __name__ == "__main__":
    main()
