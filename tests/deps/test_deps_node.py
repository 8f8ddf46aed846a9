"""Dependency snapshots on a node: lazy mounts (``--mount``), relocation to another
prefix, the CUDA driver gate and ``deps gc``; against the real index (nginx), real uv and
real FUSE mounts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from bootseer.deps import compat, relocate
from bootseer.deps import ensure as E
from bootseer.deps.mounts import unmount
from bootseer.deps.prefix import mounted_info, rmtree, sidecar
from bootseer.deps.resolve import DepsError
from bootseer.deps.snapshot import env_ref, load_manifest, publish_manifest
from tests.deps.test_deps import cfg, serve_index, wipe

pytestmark = pytest.mark.timeout(240)
PY = sys.executable


@pytest.fixture
def index(nginx_factory, tmp_path):
    urls, spec = serve_index(
        nginx_factory, tmp_path,
        [("bsnode_one", "1.0", "X = 1\ndef main():\n    print('one', X)\n",
          {"scripts": {"bsnode-one": "bsnode_one:main"}})], "bsnode-one==1.0\n")
    return urls, str(spec)


def run_py(prefix, code: str) -> str:
    p = subprocess.run([f"{prefix}/bin/python", "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "bootseer", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_relocated_to_another_prefix_rewrites_scripts_and_verifies(index, tmp_path):
    urls, spec = index
    a, b = str(tmp_path / "envs/a"), str(tmp_path / "envs/b")
    built = E.ensure(spec, a, python=PY, index_urls=urls, config=cfg(tmp_path, "n1"))
    assert built.how == "built"
    store = cfg(tmp_path, "n1").store.url
    r = E.ensure(spec, b, python=PY, index_urls=urls, config=cfg(tmp_path, "n2"))
    assert r.how == "relocated" and r.key != built.key

    def relocated_and_verified():
        # the console script's shebang and the activate script now name b, and work
        script = open(f"{b}/bin/bsnode-one").read()
        assert b in script and a not in script
        assert subprocess.run([f"{b}/bin/bsnode-one"], capture_output=True,
                              text=True).stdout.strip() == "one 1"
        assert a not in open(f"{b}/bin/activate").read()
        assert run_py(b, "import sys, bsnode_one; print(sys.prefix)") == b
        v = cli("deps", "verify", b, "--store", store)
        assert v.returncode == 0 and "OK" in v.stdout, v.stdout + v.stderr
    try:
        # a mount: the rewritten files are in its overlay, the blob is the snapshot's
        assert r.form == "mount"
        relocated_and_verified()
        # unmounted, the node's blob mounts again, rewritten again
        unmount(b)
        again = E.ensure(spec, b, python=PY, index_urls=urls, key=r.key,
                         config=cfg(tmp_path, "n2"))
        assert (again.how, again.form) == ("restored", "mount")
        relocated_and_verified()
    finally:
        wipe(b)
    # a third node asking for b restores the alias published under b's key, relocated
    # too; as a plain directory here (and so would a --read-only mount: no overlay)
    r3 = E.ensure(spec, b, python=PY, index_urls=urls, config=cfg(tmp_path, "n3"), copy=True)
    assert r3.how == "restored" and r3.key == r.key and r3.form == "directory"
    relocated_and_verified()


def test_relocation_refused_when_a_binary_names_the_prefix(index, tmp_path):
    urls, spec = index
    a, b = str(tmp_path / "envs/a"), str(tmp_path / "envs/b")
    built = E.ensure(spec, a, python=PY, index_urls=urls, config=cfg(tmp_path, "n1"))
    from bootseer.store import open_store
    store = open_store(str(tmp_path / "store"))
    from bootseer.deps.resolve import resolve_key
    r = resolve_key(spec, b, PY, urls)
    m = load_manifest(store, store.get_ref(env_ref(built.key)))
    m["relocations"]["binary"] = ["lib/libpinned.so"]     # as if an RPATH named a
    publish_manifest(store, m, built.key, r.portable)
    got = E.ensure(spec, b, python=PY, index_urls=urls, config=cfg(tmp_path, "n2"))
    assert got.how == "built"          # not relocated: built at b
    assert a not in open(f"{b}/bin/bsnode-one").read()


def test_relocate_scan_and_rewrite(tmp_path):
    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    (root / "bin/tool").write_text("#!/opt/env/bin/python\nimport x\n")
    (root / "bin/other").write_text("#!/opt/environment/bin/python\n")   # not ours
    (root / "lib.so").write_bytes(b"\0ELF/opt/env/lib\0")
    (root / "mod.pyc").write_bytes(b"\0/opt/env/mod.py")
    os.symlink("/opt/env/bin/tool", root / "bin/link")
    found = relocate.scan(str(root), "/opt/env")
    assert found == {"text": ["bin/tool"], "binary": ["lib.so"], "links": ["bin/link"]}
    with pytest.raises(DepsError, match="binary files .*lib.so"):
        relocate.rewrite(str(root), found, "/opt/env", "/srv/x")
    found["binary"] = []
    os.chmod(root / "bin/tool", 0o555)
    assert relocate.rewrite(str(root), found, "/opt/env", "/srv/x") == 2
    assert (root / "bin/tool").read_text().startswith("#!/srv/x/bin/python")
    assert (root / "bin/tool").stat().st_mode & 0o777 == 0o555
    assert (root / "bin/other").read_text() == "#!/opt/environment/bin/python\n"
    assert os.readlink(root / "bin/link") == "/srv/x/bin/tool"


def test_cuda_gate(tmp_path, monkeypatch, index):
    locked = "torch==2.4.0+cu121 \\\n    --hash=sha256:00\nnumpy==2.0.0\n"
    assert compat.cuda_runtime(locked) == "12.1"
    assert compat.cuda_runtime("nvidia-cuda-runtime-cu12==12.4.127\n") == "12.4"
    assert compat.cuda_runtime("torch==2.13.0\n") is None
    f = tmp_path / "version"
    f.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.57.02  Tue Jul 13 2021\n")
    assert compat.driver_version(str(f)) == "470.57.02"
    compat.check("12.1", "550.54.15")
    compat.check("12.1", None)         # no driver: CUDA wheels still import, on CPU
    with pytest.raises(DepsError, match=r"needs CUDA 12.1 .*>= 525.60.13.*470.57.02"):
        compat.check("12.1", "470.57.02")
    site = tmp_path / "p/lib/python3.11/site-packages/torch"
    site.mkdir(parents=True)
    (site / "version.py").write_text("__version__ = '2.4.0+cu121'\ncuda: Optional[str] = '12.1'\n")
    assert compat.installed_cuda_runtime(str(tmp_path / "p")) == "12.1"
    # a snapshot recorded as needing CUDA 12 is refused before anything is restored
    urls, spec = index
    prefix = str(tmp_path / "env")
    built = E.ensure(spec, prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n1"))
    from bootseer.store import open_store
    store = open_store(str(tmp_path / "store"))
    m = load_manifest(store, store.get_ref(env_ref(built.key)))
    publish_manifest(store, {**m, "cuda": "12.1"}, built.key)
    rmtree(prefix)
    monkeypatch.setattr(compat, "driver_version", lambda *a: "470.57.02")
    with pytest.raises(DepsError, match="driver is 470.57.02"):
        E.ensure(spec, prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n2"),
                 key=built.key)
    assert not os.path.exists(prefix)


def test_lazy_mount_outlives_the_command_records_and_prefetches(index, tmp_path):
    urls, spec = index
    prefix = str(tmp_path / "env")
    built = E.ensure(spec, prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n1"))
    rmtree(prefix)
    os.remove(f"{prefix}.lock")
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "n2/cache")}
    out = cli("deps", "ensure", spec, "--prefix", prefix, "--key", built.key, "--mount",
              "--window", "4", "--store", str(tmp_path / "store"), env=env)
    try:
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("mounted")
        info = mounted_info(prefix)
        assert os.path.ismount(prefix) and info["key"] == built.key
        assert run_py(prefix, "import bsnode_one; print(bsnode_one.X)") == "1"
        with pytest.raises(OSError):
            open(f"{prefix}/pyvenv.cfg", "a")            # read-only
        again = E.ensure(spec, prefix, python=PY, index_urls=urls, key=built.key,
                         config=cfg(tmp_path, "n2"), mount=True)
        assert again.how == "warm"
        # the window closed (4 s: long enough that the import above falls inside it on a
        # busy machine): the env tree's hot-block profile is in the store
        from bootseer.store import open_store
        from bootseer.tree import profile as prof
        store = open_store(str(tmp_path / "store"))
        deadline = time.time() + 20
        while prof.latest(store, info["tree"]) is None and time.time() < deadline:
            time.sleep(0.2)
        assert prof.latest(store, info["tree"]) is not None
    finally:
        u = cli("deps", "umount", prefix)
    assert u.returncode == 0, u.stderr
    assert not os.path.ismount(prefix) and not os.path.exists(sidecar(prefix))
    with pytest.raises(ProcessLookupError):
        os.kill(info["pid"], 0)
    # a fresh node's mount prefetches the recorded blocks
    r = E.ensure(spec, prefix, python=PY, index_urls=urls, key=built.key,
                 config=cfg(tmp_path, "n3"), mount=True)
    try:
        assert r.how == "mounted" and mounted_info(prefix)["prefetch_chunks"] > 0
        assert run_py(prefix, "import bsnode_one; print(bsnode_one.X)") == "1"
        # another key at this prefix replaces the lazy mount (here: a stale key; the
        # pins resolve to the snapshot already published, restored in place)
        r2 = E.ensure(spec, prefix, python=PY, index_urls=urls, key="sha256:" + "0" * 64,
                      config=cfg(tmp_path, "n3"), wait_s=0, copy=True)
        assert r2.how == "restored" and r2.form == "directory" and not os.path.ismount(prefix)
        assert not os.path.exists(sidecar(prefix))
        assert run_py(prefix, "import bsnode_one; print(bsnode_one.X)") == "1"
    finally:
        from bootseer.deps.mounts import unmount
        unmount(prefix)


def test_mount_with_a_dead_store_fails_clearly(index, tmp_path):
    from bootseer.deps.mounts import mount_env
    prefix = str(tmp_path / "env")
    with pytest.raises(DepsError, match="cannot mount the environment"):
        mount_env(cfg(tmp_path, "n1"), "sha256:" + "1" * 64, prefix, "sha256:" + "2" * 64,
                  timeout_s=60)
    assert not os.path.ismount(prefix) and not os.path.exists(sidecar(prefix))


def test_gc_removes_least_recently_used_never_one_in_use(index, tmp_path):
    urls, spec = index
    config = cfg(tmp_path, "n1")
    old, busy, new = (str(tmp_path / f"envs/{n}") for n in ("old", "busy", "new"))
    for p in (old, busy, new):
        E.ensure(spec, p, python=PY, index_urls=urls, config=config)
    from bootseer.deps.gc import environments, gc, records_dir
    # make the ages explicit: busy is the oldest, then old, then new
    for p, age in ((busy, 300), (old, 200), (new, 100)):
        for rec in records_dir(config).glob("*.json"):
            info = json.loads(rec.read_text())
            if info["prefix"] == p:
                rec.write_text(json.dumps({**info, "last_used": time.time() - age}))
    assert [e.prefix for e in environments(config)] == [busy, old, new]
    sizes = {e.prefix: e.bytes for e in environments(config)}
    user = subprocess.Popen([f"{busy}/bin/python", "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        cap = sizes[new] + sizes[busy]     # busy cannot go: old must
        dry = gc(config, cap, dry_run=True)
        assert [a for _, a in dry][0].startswith("in use (pid")
        assert os.path.exists(old)
        report = {e.prefix: a for e, a in gc(config, cap)}
    finally:
        user.kill()
        user.wait()
    assert report[busy].startswith("in use") and report[old] == "removed"
    assert report[new] == "kept"
    assert not os.path.exists(old) and os.path.exists(busy) and os.path.exists(new)
    assert run_py(busy, "import bsnode_one; print(bsnode_one.X)") == "1"
    out = cli("deps", "gc", "--max-size", "0", env={**os.environ, "BOOTSEER_CACHE_DIR":
                                                   str(tmp_path / "n1/cache")})
    assert out.returncode == 0 and "removed" in out.stdout, out.stdout + out.stderr
    assert not os.path.exists(busy) and not os.path.exists(new)


def test_another_interpreter_builds_under_its_own_key_and_says_why(index, tmp_path, caplog):
    """The same pins for another interpreter (here Debian's python3.11 next to this one):
    the snapshot cannot serve it; the node builds under its own key and says why."""
    other = "/usr/bin/python3.11"
    if not os.path.exists(other) or os.path.realpath(other) == os.path.realpath(PY):
        pytest.skip("needs a second Python 3.11 interpreter (Debian's /usr/bin/python3.11)")
    urls, spec = index
    a = E.ensure(spec, str(tmp_path / "envs/a"), python=PY, index_urls=urls,
                 config=cfg(tmp_path, "n1"))
    with caplog.at_level("WARNING", logger="bootseer.deps.ensure"):
        b = E.ensure(spec, str(tmp_path / "envs/b"), python=other, index_urls=urls,
                     config=cfg(tmp_path, "n2"))
    assert b.how == "built" and b.key != a.key
    assert "a snapshot of these pins exists for cpython" in caplog.text
    assert "building for this interpreter" in caplog.text
    assert run_py(str(tmp_path / "envs/b"), "import bsnode_one; print(bsnode_one.X)") == "1"


def test_restore_steps_are_traced_phases(index, tmp_path, monkeypatch):
    urls, spec = index
    prefix = str(tmp_path / "env")
    for k, v in {"LOCATION": str(tmp_path / "trace"), "JOB_ID": "j", "ATTEMPT": "0",
                 "NODE": "n0"}.items():
        monkeypatch.setenv(f"BOOTSEER_TRACE_{k}", v)
    built = E.ensure(spec, prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n1"))
    rmtree(prefix)
    E.ensure(spec, prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n2"), key=built.key,
             copy=True)
    from bootseer.report import load as trace_load

    def spans() -> dict:
        out: dict = {}
        for e in trace_load.load(tmp_path / "trace").events:
            if e.get("kind") == "span":
                out.setdefault(e["phase"], []).append(e)
        return out
    got = spans()
    for name in ("deps.resolve", "deps.build", "deps.publish", "deps.fetch", "deps.extract"):
        assert name in got, sorted(got)
    fetch, write = got["deps.fetch"][-1], got["deps.extract"][-1]
    assert fetch["attrs"]["chunks"] > 0 and fetch["attrs"]["requests"] > 0
    assert write["start"] <= fetch["end"] <= write["end"] + 1e-3   # they overlap
    # a restore as a kernel mount: the blob's fetch, then the mount
    rmtree(prefix)
    E.ensure(spec, prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n3"), key=built.key)
    try:
        got = spans()
        fetch, mount = got["deps.fetch"][-1], got["deps.mount"][-1]
        assert fetch["attrs"]["chunks"] > 0 and fetch["attrs"]["requests"] > 0
        assert fetch["attrs"]["bytes"] > 0 and fetch["end"] <= mount["start"] + 1e-3
    finally:
        unmount(prefix)


def test_a_server_this_process_started_is_seen_gone_once_it_exits():
    """``deps umount`` / a key change wait for the lazy mount's server to exit; when this
    process started it (ensure --mount in-process), the exited server is a zombie until
    reaped, which kill(pid, 0) reports alive: the wait ran into its 20 s timeout."""
    from bootseer.node.proc import pid_alive
    p = subprocess.Popen(["true"])
    deadline = time.time() + 10
    while not os.path.exists(f"/proc/{p.pid}/stat") or \
            open(f"/proc/{p.pid}/stat").read().split()[2] != "Z":
        assert time.time() < deadline
        time.sleep(0.01)
    assert not pid_alive(p.pid)
