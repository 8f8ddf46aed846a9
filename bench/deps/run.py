"""bench/deps: installing a training stack vs restoring its snapshot, on an emulated link.

    .venv/bin/python bench/deps/run.py [--stack large|small] [--rate 1gbit]
                                       [--per-connection 250m] [--nodes N] [--with-torch]

Stacks (bench/deps/stacks.py): ``large`` (default; issue #14) is 73 exact pins, the closure
of numpy, scipy, pandas, pyarrow, polars, scikit-learn, transformers, datasets, matplotlib,
sympy, networkx, pillow, statsmodels, ... (CPU-only CPython 3.11 manylinux wheels, about
270 MB; 1.2 GB and 30k files installed with bytecode); ``small`` is issue #5's 8 packages
(numpy, scipy, pandas, pyarrow, safetensors, tokenizers, tqdm, PyYAML; torch CPU too with
--with-torch). The wheels are downloaded once into a persistent cache outside the repository
(--wheel-cache/<stack>-<pin set digest>) and served by nginx as a PEP 503 index inside a
network namespace whose loopback is shaped to --rate (nginx caps each connection at
--per-connection); the bootseer store is the Debian docker-registry in the same namespace.

A node is a directory on disk (its caches and environment: the kernel's file-backed EROFS
cannot mount files on tmpfs) and a private mount namespace that lives until the node is
done, with the same prefix path on every node: a mount made by one command (an EROFS
restore, a lazy mount) is still there for the next, as on a machine. Every variant starts
on a fresh node (cold: empty caches):

  pip install           python -m venv + pip install --no-cache-dir          (small stack)
  uv cold               uv venv + uv pip install, uv's default (no bytecode), empty uv
                        cache: the baseline, the fastest way a user installs today
  uv bytecode           the same with --compile-bytecode (slower to install, faster first
                        import), shown beside the baseline, never instead of it
  uv warm               'uv cold' again with its uv cache                     (small stack)
  bootseer build        bootseer deps ensure, empty store: builds once and publishes
  bootseer restore      bootseer deps ensure --key on a fresh node (the snapshot is
                        published); its backend (directory, erofs, ...) read from --json or
                        the node's mount table
  bootseer warm         the same node again (prefix present, marker valid)
  bootseer mount        deps ensure --mount on a fresh node: the snapshot served lazily, the
                        import fetches what it reads (no profile yet: it records the start's
                        hot blocks and publishes them at 'deps umount')
  bootseer mount+prof   the same on another fresh node, prefetching the recorded profile
  bootseer lazy+prof    deps ensure --key with BOOTSEER_MOUNT_ENV_LAZY=1 on a fresh node: the
                        restore's mount made at once on its blob as a server fills it (the
                        profile's chunks first), the same blob and record at the end
Each variant's first `import` of the main packages is timed right after it (ready =
variant + first import) with the requests the package index served (nginx access log).
Then the hot import (best of 5, interleaved) in uv cold's local environment, the restored
one and through the lazy mount. With --nodes N (small stack: 4): N nodes at once on an empty
store, N x uv cold vs N x bootseer deps ensure --key.
Goals: issue #14: restore + import <= 0.5 x uv cold + import; warm <= 0.1 s; hot import
through the mount <= 1.1 x local. Issue #5 (small stack): restore <= 0.2 x uv cold and
<= 0.1 x pip; import of the restored environment <= 1.1 x local; N nodes: one build's
index requests.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "bench"))   # bench/outdir.py

import outdir  # noqa: E402
from stacks import (  # noqa: E402
    PYTHON_VERSION,
    STACKS,
    TORCH,
    Stack,
    ensure_json,
    env_backend,
    parse_figures,
    parse_marks,
    ratio_line,
    wheelhouse_name,
)

from bootseer.demo.assets import write_simple_index  # noqa: E402
from bootseer.demo.main import node_disks, scratch_tmpfs, shaped_link  # noqa: E402
from bootseer.testing import servers  # noqa: E402

PYTHON = f"/usr/bin/python{PYTHON_VERSION}"
LOG_NAME = "deps.log"   # under bench/results (outdir)
NODE_ROOT = "/opt/bsbench-deps"    # same path on every node, private per node
PREFIX = f"{NODE_ROOT}/env"
WHEEL_CACHE = "/var/cache/bootseer-bench/wheels"
HOT_ROUNDS = 5   # the best of them is compared: on a shared machine noise only adds


def wheelhouse(cache: Path, stack: str, reqs: list[str]) -> Path:
    """The pin set's wheels, downloaded once into ``cache/<stack>-<pin set digest>``
    (kept between runs), and their simple index. Built beside and renamed into place, so
    an interrupted download is never taken for a complete wheelhouse."""
    root = cache / wheelhouse_name(stack, reqs)
    if (root / "simple" / "index.html").exists():
        return root
    print(f"downloading the wheelhouse into {root} (once)", flush=True)
    part = root.with_name(root.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    (part / "wheels").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q",
                    "--disable-pip-version-check", "--only-binary=:all:",
                    "--python-version", PYTHON_VERSION, "-d", str(part / "wheels"), *reqs],
                   check=True)
    write_simple_index(part)
    part.rename(root)
    return root


class Node:
    """A node: its own directory (caches, environment) and a mount namespace held open by
    a sleeping process until :meth:`close`, with ``opt/`` bound at NODE_ROOT."""

    def __init__(self, path: Path, netns: str | None):
        self.path, self.netns = path, netns
        (path / "opt").mkdir(parents=True)
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f"mount --bind {path}/opt {NODE_ROOT} && echo up && exec sleep infinity"],
            stdout=subprocess.PIPE, text=True)
        if self.holder.stdout.readline().strip() != "up":
            raise SystemExit(f"cannot set up the node {path}")
        self.ns = os.readlink(f"/proc/{self.holder.pid}/ns/mnt")
        self.closed = False

    def argv(self, script: str) -> list[str]:
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt",
                *([f"--net=/run/netns/{self.netns}"] if self.netns else []), "sh", "-c", script]

    def backend(self) -> str:
        return env_backend(Path(f"/proc/{self.holder.pid}/mountinfo").read_text(), PREFIX,
                           (str(self.path), NODE_ROOT))

    def _members(self) -> list[int]:
        """Processes in this node's mount namespace other than the holder: ones the
        benchmark started there (a lazy mount's server)."""
        pids = []
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != self.holder.pid:
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{d}/ns/mnt") == self.ns:
                        pids.append(int(d))
        return pids

    def close(self) -> None:
        """Stop what runs in the namespace: the holder, then what the benchmark started
        there (a lazy mount's server unmounts on SIGTERM); the mounts go with the
        namespace. The directory stays until the end of the run (node_disks removes it):
        deleting 30k files between variants would load the disk the next one measures."""
        if self.closed:
            return
        self.closed = True
        self.holder.terminate()
        self.holder.wait()
        deadline = time.monotonic() + 10
        while (left := self._members()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM if time.monotonic() < deadline - 5
                            else signal.SIGKILL)
            time.sleep(0.2)


class Bench:
    def __init__(self, nodes_dir: Path, netns: str | None, index_url: str, store_url: str,
                 spec: Path, stack: Stack):
        self.nodes_dir, self.netns, self.index_url = nodes_dir, netns, index_url
        self.store_url, self.spec, self.stack = store_url, spec, stack
        self.count = 0
        self.made: list[Node] = []

    def log(self, what: str, text: str) -> None:
        """Every variant's output, kept for a look afterwards."""
        with open(outdir.path(LOG_NAME), "a") as f:
            f.write(f"--- {what}\n{text}\n")

    def node(self) -> Node:
        self.count += 1
        self.made.append(Node(self.nodes_dir / f"n{self.count}", self.netns))
        return self.made[-1]

    def close_nodes(self) -> None:
        """Every node still open (a variant failed halfway)."""
        for n in self.made:
            n.close()

    def env(self, node: Node) -> str:
        return (f"unset PIP_FIND_LINKS; export BOOTSEER_STORE_URL={shlex.quote(self.store_url)} "
                f"BOOTSEER_CACHE_DIR={node.path}/cache UV_CACHE_DIR={node.path}/uv-cache "
                f"UV_NO_CONFIG=1 PIP_CONFIG_FILE=/dev/null; ")

    def start(self, node: Node, script: str) -> subprocess.Popen:
        self.last = f"{node.path}: {script}"
        return subprocess.Popen(node.argv(self.env(node) + script), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def run(self, node: Node, script: str) -> str:
        p = self.start(node, script)
        out, _ = p.communicate()
        self.log(self.last, out)
        if p.returncode != 0:
            raise SystemExit(f"variant failed (exit {p.returncode}):\n{out[-3000:]}")
        return out

    def import_cmd(self, mark: str) -> str:
        return (f"{PREFIX}/bin/python -c 'import time; t=time.perf_counter(); "
                f"import {self.stack.imports}; print(\"{mark}\", time.perf_counter()-t, "
                f"flush=True)'")

    def timed(self, node: Node, script: str) -> dict:
        """Seconds for ``script`` and for the first import after it, timed inside the
        node's shell (nsenter and the shell are not counted), what ``deps ensure --json``
        said and what serves the prefix afterwards."""
        out = self.run(node, f"s=$(date +%s%N); {script} && e=$(date +%s%N) && "
                             f"echo \"STEP $(( (e - s) / 1000 ))\" && {self.import_cmd('IMPORT')}")
        marks = parse_marks(out)
        said = ensure_json(out)
        os.sync()   # the next variant does not pay for this one's writeback
        return {"seconds": marks["STEP"][0] / 1e6, "import_s": marks["IMPORT"][0],
                "how": said.get("how"), "form": said.get("form"),
                "backend": said.get("backend") or node.backend()}

    def hot_import(self, node: Node) -> float:
        return parse_marks(self.run(node, self.import_cmd("HOT")))["HOT"][0]

    # -- the scripts ------------------------------------------------------------------
    def pip(self) -> str:
        return (f"{PYTHON} -m venv {PREFIX} && {PREFIX}/bin/pip install -q --no-cache-dir "
                f"--disable-pip-version-check --index-url {self.index_url} -r {self.spec}")

    def uv(self, *, bytecode: bool = False) -> str:
        uv = shlex.join(_uv())
        return (f"{uv} venv -q --python {PYTHON} {PREFIX} && {uv} pip install -q --python "
                f"{PREFIX}/bin/python {'--compile-bytecode ' if bytecode else ''}"
                f"--index-url {self.index_url} -r {self.spec}")

    def ensure(self, key: str | None = None, mount: bool = False) -> str:
        k = f" --key {key}" if key else ""
        m = " --mount --window 30" if mount else ""
        return (f"{shlex.quote(sys.executable)} -m bootseer deps ensure {self.spec} "
                f"--prefix {PREFIX} --python {PYTHON} --index-url {self.index_url}{k}{m} --json")

    def umount(self, node: Node) -> dict:
        """Stop the lazy mount (publishing the profile); its time is not the start's.
        Returns its recording figures; its server's log goes into deps.log."""
        from bootseer.deps.prefix import state_dir
        state = shlex.quote(state_dir(PREFIX))
        return parse_figures(self.run(
            node, f"{shlex.quote(sys.executable)} -m bootseer deps umount {PREFIX}; rc=$?; "
                  f"cat {state}/server.log 2>/dev/null; "
                  f"echo \"FIGURES $(cat {state}/rec/figures.json 2>/dev/null)\"; exit $rc"))

    def key(self) -> str:
        p = subprocess.run([*(["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns
                              else []), sys.executable, "-m", "bootseer", "deps", "key",
                            str(self.spec), "--prefix", PREFIX, "--python", PYTHON,
                            "--index-url", self.index_url],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "BOOTSEER_STORE_URL": self.store_url})
        return p.stdout.strip()

    def parallel(self, scripts: list[tuple[Node, str]]) -> float:
        t = time.perf_counter()
        procs = [(self.start(n, s), self.last) for n, s in scripts]
        for p, what in procs:
            out, _ = p.communicate()
            self.log(what, out)
            if p.returncode != 0:
                raise SystemExit(f"a node failed (exit {p.returncode}):\n{out[-3000:]}")
        return time.perf_counter() - t


def _uv() -> list[str]:
    from bootseer.deps.resolve import uv
    return uv()


def installed_size(prefix: Path) -> tuple[int, int]:
    """(bytes, files) of an environment on disk."""
    size = files = 0
    for d, _, names in os.walk(prefix):
        for n in names:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(d, n)).st_size
                files += 1
    return size, files


class Rows:
    """Prints each row as it comes and counts the index requests since the last one."""

    def __init__(self, access: Path):
        self.access, self.rows, self.seen = access, {}, 0

    def _requests(self) -> int:
        if not self.access.exists():
            return 0
        with open(self.access, errors="replace") as f:
            return sum(1 for line in f if "/pypi/" in line)

    def add(self, name: str, figures: dict) -> None:
        """A lazy mount's recording figures, known once it is unmounted."""
        self.rows[name].update(figures)
        if figures:
            print(f"  ({name}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float)
                                             else f"{k} {v}" for k, v in figures.items())
                  + ")", flush=True)

    def skip_requests(self) -> None:
        self.seen = self._requests()

    def __call__(self, name: str, r: dict) -> None:
        n = self._requests() - self.seen
        self.seen += n
        r = {**r, "seconds": round(r["seconds"], 3), "index_requests": n}
        if r.get("import_s") is not None:
            r["import_s"] = round(r["import_s"], 3)
        self.rows[name] = r
        print(f"  {name:<28} {r['seconds']:7.2f} s   index requests {n:4d}"
              + (f"   first import {r['import_s']:5.2f} s" if "import_s" in r else "")
              + (f"   {r['how']} ({r['form']}) [{r['backend']}]" if r.get("how") else ""),
              flush=True)


def run_variants(b: Bench, nodes: int, row: Rows, hot: dict) -> None:
    """The variants in order; each node is closed as soon as nothing later needs it."""
    stack, rows = b.stack, row.rows
    if stack.installers:
        n = b.node()
        row("pip install", b.timed(n, b.pip()))
        n.close()
    n = b.node()
    row("uv bytecode", b.timed(n, b.uv(bytecode=True)))
    n.close()
    local = b.node()
    row("uv cold", b.timed(local, b.uv()))
    size, files = installed_size(local.path / "opt" / "env")
    rows["uv cold"].update(installed_mb=round(size / 1e6), installed_files=files)
    print(f"  (installed: {size / 1e6:.0f} MB, {files} files)", flush=True)
    if stack.installers:
        subprocess.run(["rm", "-rf", str(local.path / "opt" / "env")], check=True)
        row("uv warm", b.timed(local, b.uv()))
    n = b.node()
    row("bootseer build", b.timed(n, b.ensure()))
    n.close()
    key = b.key()
    row.skip_requests()   # the key's resolution is the launcher's, once per job
    print(f"  (key {key[:19]}, resolved once per job as bootseer run --deps-key does)")
    restored = b.node()
    row("bootseer restore", b.timed(restored, b.ensure(key)))
    row("bootseer warm", b.timed(restored, b.ensure(key)))
    n = b.node()
    row("bootseer mount", b.timed(n, b.ensure(key, mount=True)))
    row.add("bootseer mount", b.umount(n))    # publishes the recorded profile
    n.close()
    mounted = b.node()
    row("bootseer mount+prof", b.timed(mounted, b.ensure(key, mount=True)))
    # Hot imports, interleaved so that a busy moment of the shared machine hits all three.
    for _ in range(HOT_ROUNDS):
        for name, n in (("local (uv cold)", local), ("restored", restored),
                        ("mount+prof", mounted)):
            hot.setdefault(name, []).append(b.hot_import(n))
    row.add("bootseer mount+prof", b.umount(mounted))
    for n in (local, restored, mounted):
        n.close()
    n = b.node()   # a restore mounted at once on its blob as it is filled, profile first
    row("bootseer lazy+prof", b.timed(n, "BOOTSEER_MOUNT_ENV_LAZY=1 " + b.ensure(key)))
    b.run(n, f"{shlex.quote(sys.executable)} -m bootseer deps umount {PREFIX}")
    n.close()
    if nodes:
        row(f"{nodes} nodes uv cold", {"seconds": b.parallel([(b.node(), b.uv())
                                                              for _ in range(nodes)])})
        b.store_url += "-n"    # an empty store for the N-node ensure: a new repository
        row(f"{nodes} nodes bootseer ensure",
            {"seconds": b.parallel([(b.node(), b.ensure(key)) for _ in range(nodes)])})


def report(rows: dict, hot: dict, nodes: int) -> dict:
    """Ratios against the goals, printed; returned for the JSON."""
    uv = rows["uv cold"]
    ready = {k: r["seconds"] + r["import_s"] for k, r in rows.items()
             if r.get("import_s") is not None}
    hot_best = {k: min(v) for k, v in hot.items()}
    print("\nenvironment ready + main packages imported (the start a job waits for):")
    for k, v in ready.items():
        print(f"  {k:<28} {v:7.2f} s  {v / ready['uv cold']:5.2f}x uv cold"
              + (f"   [{rows[k]['backend']}]" if k.startswith("bootseer") else ""))
    print(f"hot import (best / median of {HOT_ROUNDS}): "
          + ", ".join(f"{k} {hot_best[k]:.2f} / {statistics.median(v):.2f} s"
                      for k, v in hot.items()))
    local = hot_best["local (uv cold)"]
    goals = {
        "restore_ready_vs_uv": ready["bootseer restore"] / ready["uv cold"],
        "warm_s": rows["bootseer warm"]["seconds"],
        "mount_hot_import_vs_local": hot_best["mount+prof"] / local,
        "restored_hot_import_vs_local": hot_best["restored"] / local,
        "mount_prof_ready_vs_uv": ready["bootseer mount+prof"] / ready["uv cold"],
        "restore_vs_uv_step": rows["bootseer restore"]["seconds"] / uv["seconds"],
        "lazy_prof_ready_vs_uv": ready["bootseer lazy+prof"] / ready["uv cold"],
    }
    lines = [ratio_line("restore + import / uv cold + import", goals["restore_ready_vs_uv"],
                        0.5),
             ratio_line("warm ensure", goals["warm_s"], 0.1, " s"),
             ratio_line("hot import through the mount / local",
                        goals["mount_hot_import_vs_local"], 1.1),
             ratio_line("hot import restored / local", goals["restored_hot_import_vs_local"],
                        1.1),
             f"mount+prof + import / uv cold + import {goals['mount_prof_ready_vs_uv']:.2f}x "
             f"(no goal)",
             ratio_line("restore / uv cold (issue #5)", goals["restore_vs_uv_step"], 0.2),
             ratio_line("lazy+prof restore + import / uv cold + import",
                        goals["lazy_prof_ready_vs_uv"], 0.5)]
    if "pip install" in rows:
        goals["restore_vs_pip_step"] = rows["bootseer restore"]["seconds"] / \
            rows["pip install"]["seconds"]
        lines.append(ratio_line("restore / pip (issue #5)", goals["restore_vs_pip_step"], 0.1))
    if nodes:
        goals["index_requests_n_nodes"] = rows[f"{nodes} nodes bootseer ensure"]["index_requests"]
        goals["index_requests_one_build"] = rows["bootseer build"]["index_requests"]
        lines.append(f"index requests, {nodes} nodes ensure {goals['index_requests_n_nodes']}"
                     f" vs one build {goals['index_requests_one_build']} (goal: equal)")
    print(f"goals (restore backend: {rows['bootseer restore']['backend']}):\n  "
          + "\n  ".join(lines))
    return {"ready_s": {k: round(v, 3) for k, v in ready.items()},
            "hot_import_s": {k: [round(x, 3) for x in v] for k, v in hot.items()},
            "goals": {k: round(v, 3) for k, v in goals.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", choices=sorted(STACKS), default="large",
                   help="the package set (default large)")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--per-connection", default="250m", help="nginx limit_rate, bits/s")
    p.add_argument("--nodes", type=int, help="N nodes at once (default: small 4, large 0)")
    p.add_argument("--with-torch", action="store_true", help="add torch CPU to the stack")
    p.add_argument("--wheel-cache", default=WHEEL_CACHE,
                   help=f"where wheelhouses are kept between runs (default {WHEEL_CACHE})")
    p.add_argument("--out", help="default bench/results/deps.json (small: deps-small.json)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench/deps needs root (network namespace, mount namespaces, FUSE)",
              file=sys.stderr)
        return 1
    stack = STACKS[args.stack]
    nodes = stack.nodes if args.nodes is None else args.nodes
    out = outdir.path(args.out or ("deps.json" if stack.name == "large"
                                   else f"deps-{stack.name}.json"))
    reqs = list(stack.pins) + ([TORCH] if args.with_torch else [])
    index = wheelhouse(Path(args.wheel_cache), stack.name, reqs)
    Path(NODE_ROOT).mkdir(parents=True, exist_ok=True)
    from bootseer.demo.link import rate_bits
    limit = str(int(rate_bits(args.per_connection + 'bit') / 8))
    hot: dict[str, list[float]] = {}
    outdir.path(LOG_NAME).write_text("")
    with scratch_tmpfs("8g") as scratch, node_disks() as nodes_dir, \
            shaped_link(args.rate) as netns:
        www = scratch / "www"
        www.mkdir()
        (www / "pypi").symlink_to(index)
        web = servers.start_nginx(www, scratch / "nginx-run", netns=netns, limit_rate=limit,
                                  access_log=True)
        row = Rows(scratch / "nginx-run" / "access.log")
        reg = servers.start_registry(scratch / "registry", scratch / "registry-run",
                                     netns=netns)
        try:
            spec = scratch / "requirements.txt"
            spec.write_text("\n".join(reqs) + "\n")
            b = Bench(nodes_dir, netns, f"{web.url}/pypi/simple",
                      f"oci://127.0.0.1:{reg.port}/bench", spec, stack)
            size = sum(f.stat().st_size for f in (index / "wheels").iterdir())
            print(f"stack {stack.name}: {len(reqs)} pins, {size / 1e6:.0f} MB of wheels; link "
                  f"{args.rate}, {args.per_connection}bit/s per connection; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            try:
                run_variants(b, nodes, row, hot)
            finally:
                b.close_nodes()
        finally:
            web.stop()
            reg.stop()
    summary = report(row.rows, hot, nodes)
    outdir.write_json(out, {"args": vars(args), "stack": stack.name, "pins": reqs,
                            "wheels_mb": round(size / 1e6), "rows": row.rows,
                            "load_after": os.getloadavg()[0], **summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
