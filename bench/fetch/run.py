"""bench/fetch: the fetcher against one stream, on an emulated link.

    .venv/bin/python bench/fetch/run.py [--size-mib 256] [--rate 1gbit] [--per-connection 125m]

A blob in the store layout is served by nginx inside a network namespace whose loopback
is shaped with tc tbf to --rate, each connection capped by nginx limit_rate (one storage
node's stream); the same blob is also pushed to the Debian docker-registry, read through
an nginx proxy that applies the same cap (in its own namespace shaped to twice --rate, as
the proxy hop crosses the shaped loopback too). Variants, for each server, measured side by
side in one run, each --reps times (median):
  one stream        a single GET of the whole blob
  fetcher           bootseer's fetcher: 8 MiB parts, many in flight, verified
  fetcher, no verify
Goals (issue #2): fetcher >= 85% of the link and >= 6x one stream. Note: nginx lets the
first second of each request through unthrottled, so the per-connection cap binds only
requests longer than one second (the single stream), not 8 MiB parts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))   # bench/outdir.py

import outdir  # noqa: E402

from bootseer.demo.link import rate_bits, shaped_namespace  # noqa: E402
from bootseer.testing import servers  # noqa: E402

CLIENT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from bootseer.config import FetchConfig
from bootseer.store import open_store
from bootseer.store import http
from bootseer.store.fetch import Fetcher, fetch_blob
digest, size, reps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
out = {}
for label, url in zip(sys.argv[5::2], sys.argv[6::2]):
    store = open_store(url)
    blob_url = store._blob_url(digest)
    def one_stream():
        assert len(http.get_range(blob_url, 0, size)) == size
    def fetcher(verify):
        with Fetcher(FetchConfig(verify=verify)) as f:
            assert len(fetch_blob(f, store, digest, size=size, verify=verify)) == size
    for name, fn in [("one stream", one_stream), ("fetcher", lambda: fetcher(True)),
                     ("fetcher, no verify", lambda: fetcher(False))]:
        times = []
        for _ in range(reps):
            t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
        out[f"{label}: {name}"] = times
print(json.dumps(out))
"""

UPLOAD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from bootseer.store import open_store
registry, local, digest = sys.argv[2], sys.argv[3], sys.argv[4]
with open(open_store(local).path(digest), "rb") as f:
    open_store(registry).write(digest, f.read())
"""


def client(ns: str, digest: str, args, label: str, url: str) -> dict:
    out = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c", CLIENT,
                          str(ROOT / "src"), digest, str(args.size_mib << 20), str(args.reps),
                          label, url], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--per-connection", default="125m", help="bits/s per connection")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench/fetch needs root (network namespace, tmpfs)", file=sys.stderr)
        return 1
    per_conn = int(rate_bits(args.per_connection + "bit") / 8)
    scratch = Path(tempfile.mkdtemp(prefix="bsbench-", dir="/var/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.size_mib * 3 + 64}m", "tmpfs",
                    str(scratch)], check=True)
    try:
        from bootseer.store import open_store, sha256_digest
        data = os.urandom(args.size_mib << 20)
        digest = sha256_digest(data)
        open_store(str(scratch / "store")).write(digest, data)
        (scratch / "www").mkdir()
        del data
        res = {}
        with shaped_namespace(args.rate) as ns:
            web = servers.start_nginx(scratch / "store", scratch / "nginx", netns=ns,
                                      limit_rate=str(per_conn))
            try:
                res.update(client(ns, digest, args, "nginx", web.url))
            finally:
                web.stop()
        # The registry sits behind an nginx proxy that applies the same per-connection cap.
        # The proxy hop crosses the shaped loopback too, so every byte crosses it twice:
        # this namespace is shaped to twice the rate, leaving the client the same link.
        double = f"{int(rate_bits(args.rate) * 2 / 1e6)}mbit"
        with shaped_namespace(double) as ns:
            reg = servers.start_registry(scratch / "registry", scratch / "registry-run",
                                         netns=ns)
            web = None
            try:
                proxy = (f"location /v2/ {{ proxy_pass http://127.0.0.1:{reg.port}; "
                         f"proxy_http_version 1.1; limit_rate {per_conn}; }}")
                web = servers.start_nginx(scratch / "www", scratch / "proxy", netns=ns,
                                          extra_locations=proxy)
                subprocess.run(["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c",
                                UPLOAD, str(ROOT / "src"),
                                f"oci://127.0.0.1:{reg.port}/bench/fetch",
                                str(scratch / "store"), digest], check=True)
                res.update(client(ns, digest, args, "registry",
                                  f"oci://127.0.0.1:{web.port}/bench/fetch"))
            finally:
                if web is not None:
                    web.stop()
                reg.stop()
    finally:
        subprocess.run(["umount", "-l", str(scratch)])
        scratch.rmdir()
    link = rate_bits(args.rate) / 8 / 2**20
    print(f"blob {args.size_mib} MiB, link {args.rate} ({link:.0f} MiB/s), "
          f"{args.per_connection}bit/s per connection, median of {args.reps}")
    print(f"{'variant':30} {'s':>7} {'MiB/s':>8} {'% link':>7} {'x one stream':>13}")
    for name, times in res.items():
        base = statistics.median(res[name.split(":")[0] + ": one stream"])
        t = statistics.median(times)
        mibs = args.size_mib / t
        print(f"{name:30} {t:7.2f} {mibs:8.1f} {100 * mibs / link:6.1f}% {base / t:12.1f}x")
    outdir.write_json("fetch.json", {"args": vars(args), "runs": res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
