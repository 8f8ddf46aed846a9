"""bench/deps: installing a training stack vs restoring its snapshot, on an emulated link.

    .venv/bin/python bench/deps/run.py [--rate 1gbit] [--per-connection 250m] [--nodes 4]
                                       [--with-torch] [--reps 1]

The stack (numpy, scipy, pandas, pyarrow, safetensors, tokenizers, tqdm, PyYAML; torch CPU
too with --with-torch) is downloaded once as wheels into the kept assets directory and served
by nginx as a PEP 503 index inside a network namespace whose loopback is shaped to --rate
(nginx caps each connection at --per-connection); the bootseer store is the Debian
docker-registry in the same namespace. Every variant runs on a fresh node: a private mount
namespace with its own empty caches and the same prefix path, all on a tmpfs.

  pip install           python -m venv + pip install --no-cache-dir
  uv cold               uv venv + uv pip install --compile-bytecode, empty uv cache
  uv warm               the same with the uv cache of 'uv cold' (a node that installed before)
  bootseer build        bootseer deps ensure, empty store: builds once and publishes
  bootseer restore      bootseer deps ensure --key on a fresh node (the snapshot is published)
  bootseer warm         the same node again (prefix present, marker valid)
  bootseer mount        deps ensure --mount on a fresh node: the snapshot served lazily, so
                        the import fetches what it reads (first mount: no profile; it
                        records and publishes the start's hot blocks)
  bootseer mount+prof   the same on another fresh node, prefetching the recorded profile
Then N nodes at once on an empty store: N x uv cold vs N x bootseer deps ensure --key (the
key resolved once for the job, as `bootseer run --deps-key` does: one node resolves and
builds under the lease, the others wait for the publish and restore).
Each variant also reports the first `import` of the main packages in its result and the
requests the package index served (nginx access log).
Goals (issue #5): cold restore <= 0.2 x uv cold and <= 0.1 x pip (bytecode compiled in
all); warm node <= 0.1 s; import of a restored environment <= 1.1 x a pip-installed one;
with N nodes the index sees one build's requests, not N.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from bootseer.demo.assets import write_simple_index  # noqa: E402
from bootseer.demo.main import scratch_tmpfs, shaped_link  # noqa: E402
from bootseer.testing import servers  # noqa: E402

STACK = ["numpy==2.2.6", "scipy==1.15.3", "pandas==2.2.3", "pyarrow==20.0.0",
         "safetensors==0.5.3", "tokenizers==0.21.1", "tqdm==4.67.1", "PyYAML==6.0.2"]
TORCH = "torch==2.13.0"
IMPORTS = "numpy, scipy.linalg, pandas, pyarrow, safetensors, tokenizers, yaml"
PYTHON = "/usr/bin/python3.11"
LOG = ROOT / "bench/results/deps.log"
NODE_ROOT = "/opt/bsbench-deps"    # same path on every node, private per node
PREFIX = f"{NODE_ROOT}/env"


def wheelhouse(assets: Path, reqs: list[str]) -> Path:
    """Download the stack's wheels once (kept between runs) and write the simple index."""
    tag = "torch" if any(r.startswith("torch") for r in reqs) else "cpu"
    root = assets / f"pypi-{tag}"
    if not (root / "simple" / "index.html").exists():
        print(f"downloading the wheelhouse into {root} (once)", flush=True)
        wheels = root / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q",
                        "--disable-pip-version-check", "--only-binary=:all:",
                        "--python-version", "3.11", "-d", str(wheels), *reqs], check=True)
        write_simple_index(root)
    return root


class Bench:
    def __init__(self, scratch: Path, netns: str | None, index_url: str, store_url: str,
                 spec: Path):
        self.scratch, self.netns, self.index_url = scratch, netns, index_url
        self.store_url, self.spec = store_url, spec
        self.nodes = 0

    def log(self, text: str) -> None:
        """Every variant's output, kept for a look afterwards."""
        with open(LOG, "a") as f:
            f.write(f"--- {' '.join(self.last)}\n{text}\n")

    def node(self) -> Path:
        self.nodes += 1
        d = self.scratch / "nodes" / f"n{self.nodes}"
        (d / "opt").mkdir(parents=True)
        return d

    def argv(self, node: Path, script: str) -> list[str]:
        """``script`` on ``node``: shaped network, private mount namespace, own caches."""
        env = (f"export BOOTSEER_STORE_URL={shlex.quote(self.store_url)} "
               f"BOOTSEER_CACHE_DIR={node}/cache UV_CACHE_DIR={node}/uv-cache "
               f"UV_NO_CONFIG=1 PIP_CONFIG_FILE=/dev/null; ")
        inner = f"mount --bind {node}/opt {NODE_ROOT} && {env}{script}"
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner]
        return (["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []) + argv

    def start(self, node: Path, script: str) -> subprocess.Popen:
        self.last = [str(node), script]
        return subprocess.Popen(self.argv(node, script), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def timed(self, node: Path, script: str, after: str = "") -> tuple[float, float]:
        """(seconds for ``script``, seconds of the first import in the result); ``after``
        runs once the import is timed (not counted). Timed inside the node's shell, so the
        harness (nsenter, unshare, the bind mount) is not counted."""
        p = self.start(node, f"s=$(date +%s%N); {script} && e=$(date +%s%N) && "
                             f"echo \"STEP $(( (e - s) / 1000 ))\" && {PREFIX}/bin/python -c "
                             f"'import time; t=time.perf_counter(); import {IMPORTS}; "
                             f"print(\"IMPORT\", time.perf_counter()-t, flush=True)' "
                             f"2>/dev/null{after}")
        out, _ = p.communicate()
        self.log(out)
        if p.returncode != 0:
            raise SystemExit(f"variant failed (exit {p.returncode}):\n{out[-3000:]}")
        step = int(next(l for l in out.splitlines() if l.startswith("STEP ")).split()[1]) / 1e6
        imp = float(next(l for l in out.splitlines() if l.startswith("IMPORT")).split()[1])
        return step, imp

    # -- the scripts ------------------------------------------------------------------
    def pip(self) -> str:
        return (f"{PYTHON} -m venv {PREFIX} && {PREFIX}/bin/pip install -q --no-cache-dir "
                f"--disable-pip-version-check --index-url {self.index_url} -r {self.spec}")

    def uv(self) -> str:
        uv = shlex.join(_uv())
        return (f"{uv} venv -q --python {PYTHON} {PREFIX} && {uv} pip install -q --python "
                f"{PREFIX}/bin/python --compile-bytecode --index-url {self.index_url} -r {self.spec}")

    def ensure(self, key: str | None = None, mount: bool = False) -> str:
        k = f" --key {key}" if key else ""
        m = " --mount --window 30" if mount else ""
        return (f"{shlex.quote(sys.executable)} -m bootseer deps ensure {self.spec} "
                f"--prefix {PREFIX} --python {PYTHON} --index-url {self.index_url}{k}{m}")

    def umount(self) -> str:
        """Stop the lazy mount (publishing the profile); its time is not the start's."""
        return f"; {shlex.quote(sys.executable)} -m bootseer deps umount {PREFIX}"

    def key(self) -> str:
        p = subprocess.run([*(["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns
                              else []), sys.executable, "-m", "bootseer", "deps", "key",
                            str(self.spec), "--prefix", PREFIX, "--python", PYTHON,
                            "--index-url", self.index_url],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "BOOTSEER_STORE_URL": self.store_url})
        return p.stdout.strip()

    def parallel(self, scripts: list[tuple[Path, str]]) -> float:
        t = time.perf_counter()
        procs = [self.start(n, s) for n, s in scripts]
        for p in procs:
            out, _ = p.communicate()
            self.log(out)
            if p.returncode != 0:
                raise SystemExit(f"a node failed (exit {p.returncode}):\n{out[-3000:]}")
        return time.perf_counter() - t


def _uv() -> list[str]:
    from bootseer.deps.resolve import uv
    return uv()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--per-connection", default="250m", help="nginx limit_rate, bits/s")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--with-torch", action="store_true", help="add torch CPU to the stack")
    p.add_argument("--assets", default="/var/tmp/bootseer-bench/deps")
    p.add_argument("--out", default=str(ROOT / "bench/results/deps.json"))
    args = p.parse_args()
    reqs = STACK + ([TORCH] if args.with_torch else [])
    index = wheelhouse(Path(args.assets), reqs)
    Path(NODE_ROOT).mkdir(parents=True, exist_ok=True)
    from bootseer.demo.link import rate_bits
    limit = str(int(rate_bits(args.per_connection + 'bit') / 8))
    rows: dict[str, dict] = {}
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    with scratch_tmpfs("12g") as scratch, shaped_link(args.rate) as netns:
        www = scratch / "www"
        www.mkdir()
        (www / "pypi").symlink_to(index)
        web = servers.start_nginx(www, scratch / "nginx-run", netns=netns, limit_rate=limit,
                                  access_log=True)
        access = scratch / "nginx-run" / "access.log"

        def index_requests() -> int:
            return sum(1 for line in open(access, errors="replace") if "/pypi/" in line) \
                if access.exists() else 0
        reg = servers.start_registry(scratch / "registry", scratch / "registry-run",
                                     netns=netns)
        try:
            spec = scratch / "requirements.txt"
            spec.write_text("\n".join(reqs) + "\n")
            store = f"oci://127.0.0.1:{reg.port}/bench"
            b = Bench(scratch, netns, f"{web.url}/pypi/simple", store, spec)
            size = sum(f.stat().st_size for f in (index / "wheels").iterdir())
            print(f"stack: {len(reqs)} requirements, {size / 1e6:.0f} MB of wheels; link "
                  f"{args.rate}, {args.per_connection}bit/s per connection", flush=True)

            seen = [0]

            def row(name, secs, imp=None):
                n_req = index_requests() - seen[0]
                seen[0] += n_req
                rows[name] = {"seconds": round(secs, 3), "import_s": imp and round(imp, 3),
                              "index_requests": n_req}
                print(f"  {name:<28} {secs:7.2f} s   index requests {n_req:4d}"
                      + (f"   first import {imp:5.2f} s" if imp is not None else ""),
                      flush=True)

            row("pip install", *b.timed(b.node(), b.pip()))
            uv_node = b.node()
            row("uv cold", *b.timed(uv_node, b.uv()))
            subprocess.run(["rm", "-rf", str(uv_node / "opt" / "env")], check=True)
            row("uv warm", *b.timed(uv_node, b.uv()))
            row("bootseer build", *b.timed(b.node(), b.ensure()))
            key = b.key()
            seen[0] = index_requests()  # the key's resolution is the launcher's, once per job
            print(f"  (key {key[:19]}, resolved once per job as bootseer run --deps-key does)")
            node = b.node()
            row("bootseer restore", *b.timed(node, b.ensure(key)))
            row("bootseer warm", *b.timed(node, b.ensure(key)))
            row("bootseer mount", *b.timed(b.node(), b.ensure(key, mount=True), b.umount()))
            row("bootseer mount+prof", *b.timed(b.node(), b.ensure(key, mount=True),
                                                b.umount()))
            n = args.nodes
            row(f"{n} nodes uv cold", b.parallel([(b.node(), b.uv()) for _ in range(n)]))
            # An empty store for the N-node ensure: a new repository name.
            b.store_url = f"oci://127.0.0.1:{reg.port}/bench-n"
            row(f"{n} nodes bootseer ensure",
                b.parallel([(b.node(), b.ensure(key)) for _ in range(n)]))
        finally:
            web.stop()
            reg.stop()
    uv_cold, pip = rows["uv cold"]["seconds"], rows["pip install"]["seconds"]
    print("\nratios to uv cold:")
    for name, r in rows.items():
        print(f"  {name:<28} {r['seconds'] / uv_cold:6.2f}x")
    restore = rows["bootseer restore"]
    n = args.nodes
    print(f"goals: restore / uv cold {restore['seconds'] / uv_cold:.2f} (<= 0.2), "
          f"restore / pip {restore['seconds'] / pip:.2f} (<= 0.1), "
          f"warm {rows['bootseer warm']['seconds']:.2f} s (<= 0.1, includes starting "
          f"the bootseer process and resolving nothing), import restored / pip "
          f"{restore['import_s'] / rows['pip install']['import_s']:.2f} (<= 1.1), "
          f"index requests {n} nodes {rows[f'{n} nodes bootseer ensure']['index_requests']}"
          f" vs one build {rows['bootseer build']['index_requests']}")
    ready = {k: rows[k]["seconds"] + rows[k]["import_s"] for k in
             ("pip install", "uv cold", "bootseer restore", "bootseer mount",
              "bootseer mount+prof")}
    print("environment ready and main packages imported (the start a job waits for): "
          + ", ".join(f"{k} {v:.2f} s ({v / ready['uv cold']:.2f}x uv cold)"
                      for k, v in ready.items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
