"""Dependency snapshots against a real package index (nginx) and real uv: build once,
restore elsewhere, warm nodes, one builder, and the faults."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys

import pytest

from bootseer.config import BootseerConfig
from bootseer.demo.assets import write_simple_index
from bootseer.deps import ensure as E
from bootseer.deps.prefix import rmtree
from bootseer.deps.resolve import DepsError
from tests.run.test_baseline import make_wheel

pytestmark = pytest.mark.timeout(240)
PY = sys.executable


def serve_index(nginx_factory, tmp_path, wheels: list[tuple], requirements: str):
    """A PEP 503 index of ``wheels`` (make_wheel arguments) served by nginx, and a
    requirements file: (index URLs, spec path)."""
    root = tmp_path / "index"
    (root / "wheels").mkdir(parents=True)
    for name, version, code, *scripts in wheels:
        make_wheel(root / "wheels", name, version, code, **(scripts[0] if scripts else {}))
    write_simple_index(root)
    server = nginx_factory(root)
    spec = tmp_path / "requirements.txt"
    spec.write_text(requirements)
    return [f"{server.url}/simple"], spec


@pytest.fixture
def index(nginx_factory, tmp_path):
    return serve_index(nginx_factory, tmp_path, [("bsdeps_one", "1.0", "X = 1\n"),
                                                 ("bsdeps_two", "2.0", "Y = 2\n")],
                       "bsdeps-one==1.0\nbsdeps-two==2.0\n")


def cfg(tmp_path, node: str) -> BootseerConfig:
    return BootseerConfig.from_env(overrides={
        "store": {"url": str(tmp_path / "store")},
        "cache": {"dir": str(tmp_path / node / "cache")}})


def imports(prefix) -> str:
    return subprocess.run([f"{prefix}/bin/python", "-c", "import bsdeps_one, bsdeps_two; "
                           "print(bsdeps_one.X + bsdeps_two.Y)"], capture_output=True,
                          text=True).stdout.strip()


def wipe(prefix: str) -> None:
    """Take the environment at ``prefix`` away (unmounted first when it is a mount), as a
    fresh node would not have it."""
    from bootseer.deps.mounts import unmount
    from bootseer.deps.prefix import sidecar
    if os.path.exists(sidecar(prefix)):
        unmount(prefix)
    rmtree(prefix)


def test_build_once_restore_warm(index, tmp_path):
    urls, spec = index
    prefix = str(tmp_path / "envs/train")
    r = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "a"))
    assert r.how == "built" and r.form == "directory" and imports(prefix) == "3"
    assert E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "a"),
                    key=r.key).how == "warm"
    rmtree(prefix)                      # a fresh node: same prefix, empty cache
    # copy: a plain directory of extracted files (the kernel mount: test_deps_kernel.py)
    r2 = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "b"),
                  copy=True)
    assert r2.how == "restored" and r2.key == r.key and imports(prefix) == "3"
    assert r2.form == "directory" and not os.path.ismount(prefix)
    mode = os.stat(f"{prefix}/lib/python3.11/site-packages/bsdeps_one/__init__.py").st_mode
    assert not mode & 0o222                 # restored files are read-only
    out = subprocess.run([PY, "-m", "bootseer", "deps", "verify", prefix, "--store",
                          str(tmp_path / "store")], capture_output=True, text=True)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


def test_verify_json_says_what_changed_and_nothing_else_on_stdout(index, tmp_path):
    urls, spec = index
    prefix = str(tmp_path / "env")
    E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "a"))
    verify = [PY, "-m", "bootseer", "deps", "verify", prefix, "--store",
              str(tmp_path / "store"), "--json"]
    out = subprocess.run(verify, capture_output=True, text=True)
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["schema"] == 1 and doc["ok"] is True, out.stderr
    assert doc["prefix"] == prefix and doc["tree"].startswith("sha256:") and doc["problems"] == []
    assert doc["files"] > 2
    site = f"{prefix}/lib/python3.11/site-packages"
    os.chmod(f"{site}/bsdeps_one/__init__.py", 0o644)
    with open(f"{site}/bsdeps_one/__init__.py", "w") as f:
        f.write("X = 99\n")
    os.chmod(f"{site}/bsdeps_two", 0o755)
    os.unlink(f"{site}/bsdeps_two/__init__.py")
    out = subprocess.run(verify, capture_output=True, text=True)
    doc = json.loads(out.stdout)
    assert out.returncode == 1 and doc["ok"] is False
    assert sorted((p["problem"], p["path"]) for p in doc["problems"]) == [
        ("missing", "/lib/python3.11/site-packages/bsdeps_two/__init__.py"),
        ("modified", "/lib/python3.11/site-packages/bsdeps_one/__init__.py")]
    out = subprocess.run([*verify[:5], str(tmp_path), *verify[6:]], capture_output=True,
                         text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("bootseer: error: ") and "not a restored" in out.stderr


def test_key_handed_to_a_cold_node_restores_without_the_index(index, tmp_path, nginx_factory):
    urls, spec = index
    prefix = str(tmp_path / "env")
    r = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "a"))
    rmtree(prefix)
    dead = ["http://127.0.0.1:9/simple"]       # the index is unreachable now
    seen = []
    r2 = E.ensure(str(spec), prefix, python=PY, index_urls=dead, key=r.key,
                  config=cfg(tmp_path, "b"), progress=lambda n, total: seen.append((n, total)))
    assert r2.how == "restored" and imports(prefix) == "3"
    assert seen and sum(n for n, _ in seen) == seen[-1][1]   # the progress bar's feed
    assert E.ensure(str(spec), prefix, python=PY, index_urls=dead, key=r.key,
                    config=cfg(tmp_path, "b")).how == "warm"
    wipe(prefix)


def _ensure_proc(spec, prefix, urls, store, cache, out):
    config = BootseerConfig.from_env(overrides={"store": {"url": store}, "cache": {"dir": cache}})
    r = E.ensure(spec, prefix, python=PY, index_urls=urls, config=config)
    with open(out, "w") as f:
        f.write(r.how)


def test_two_ensures_on_one_node_build_once(index, tmp_path):
    urls, spec = index
    prefix = str(tmp_path / "env")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_ensure_proc,
                         args=(str(spec), prefix, urls, str(tmp_path / "store"),
                               str(tmp_path / "c"), str(tmp_path / f"out{i}")))
             for i in range(2)]
    [p.start() for p in procs]
    [p.join(200) for p in procs]
    hows = sorted((tmp_path / f"out{i}").read_text() for i in range(2))
    assert hows == ["built", "warm"]


def test_faults_unresolvable_editable_foreign(index, tmp_path):
    urls, spec = index
    bad = tmp_path / "bad.txt"
    bad.write_text("bsdeps-one==9.9\n")
    with pytest.raises(DepsError, match="resolving"):
        E.ensure(str(bad), str(tmp_path / "e1"), python=PY, index_urls=urls,
                 config=cfg(tmp_path, "a"))
    assert not (tmp_path / "e1").exists()
    ed = tmp_path / "requirements.txt"
    ed.write_text("-e ./src/mypkg\n")
    with pytest.raises(DepsError, match="editable"):
        E.ensure(str(ed), str(tmp_path / "e2"), python=PY, index_urls=urls,
                 config=cfg(tmp_path, "a"))
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep")
    spec.write_text("bsdeps-one==1.0\n")
    with pytest.raises(DepsError, match="not made by bootseer"):
        E.ensure(str(spec), str(foreign), python=PY, index_urls=urls, config=cfg(tmp_path, "a"))
    assert (foreign / "precious.txt").read_text() == "keep"


def test_corrupt_snapshot_installs_instead(index, tmp_path):
    urls, spec = index
    prefix = str(tmp_path / "env")
    E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "a"))
    rmtree(prefix)
    from bootseer.store import open_store
    store = open_store(str(tmp_path / "store"))
    for d in store.list():  # corrupt every pack blob (big ones), keep manifests/TOCs
        p = store.path(d)
        if p.stat().st_size > 1000:
            os.chmod(p, 0o644)
            data = bytearray(p.read_bytes())
            data[len(data) // 2] ^= 0xFF
            p.write_bytes(bytes(data))
    r = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "b"))
    assert r.how == "installed" and imports(prefix) == "3"
    assert not [p for p in os.listdir(tmp_path) if ".restoring-" in p or ".mount" in p]
    blobs = tmp_path / "b" / "cache" / "erofs"   # the mount's fetch kept no part of a blob
    assert not [p for p in os.listdir(blobs) if ".blob" in p] if blobs.exists() else True


def test_expired_lease_is_taken_over(index, tmp_path):
    urls, spec = index
    from bootseer.deps.resolve import resolve_key
    from bootseer.store import open_store
    prefix = str(tmp_path / "env")
    key = resolve_key(str(spec), prefix, PY, urls).key
    store = open_store(str(tmp_path / "store"))
    dead = E.Lease(store, key, ttl=0.5)     # a builder that died holding the lease
    assert dead.acquire()
    dead._stop.set()
    import time
    time.sleep(0.8)
    r = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "a"),
                 lease_ttl_s=5)
    assert r.how == "built"


@pytest.mark.root
def test_four_node_processes_one_builds_three_restore(index, registry, tmp_path):
    """Four processes, each a fresh node (own mount namespace, own cache, the same prefix
    path), start the same environment at once against the real index and a registry
    store: one takes the lease and builds, three wait for the publish and restore."""
    from tests.conftest import is_root, need
    need(is_root() and shutil.which("unshare") is not None, "mount namespaces need root")
    urls, spec = index
    root = "/opt/bootseer-test-deps"
    os.makedirs(root, exist_ok=True)
    store = f"oci://127.0.0.1:{registry.port}/bs/deps4"
    env = {**os.environ, "BOOTSEER_STORE_URL": store}
    key = subprocess.run([PY, "-m", "bootseer", "deps", "key", str(spec), "--prefix",
                          f"{root}/env", "--python", PY, "--index-url", urls[0]],
                         capture_output=True, text=True, env=env, check=True).stdout.strip()
    procs = []
    for i in range(4):
        node = tmp_path / f"node{i}"
        (node / "opt").mkdir(parents=True)
        ensure = (f"{PY} -m bootseer deps ensure {spec} --prefix {root}/env --python {PY} "
                  f"--index-url {urls[0]} --key {key} && "
                  f"{root}/env/bin/python -c "
                  f"'import bsdeps_one as a, bsdeps_two as b; print(a.X + b.Y)'")
        script = (f"mount --bind {node}/opt {root} && "
                  f"BOOTSEER_CACHE_DIR={node}/cache exec sh -c \"{ensure}\"")
        procs.append(subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh",
                                       "-c", script], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    hows = sorted(o[0].split()[0] for o in outs)
    assert hows == ["built", "restored", "restored", "restored"], outs
    assert all(o[0].split()[-1] == "3" for o in outs), outs


def test_process_killed_mid_restore_leaves_no_partial_prefix(index, tmp_path, nginx_factory):
    """A restore killed halfway (slow store) leaves no prefix at all; the next ensure
    restores a whole environment and sweeps the dead process's temporary directory."""
    import signal
    import time
    urls, spec = index
    prefix = str(tmp_path / "env")
    r = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "a"))
    rmtree(prefix)
    slow = nginx_factory(tmp_path / "store", limit_rate="1k")   # a store that crawls
    env = {**os.environ, "BOOTSEER_STORE_URL": slow.url,
           "BOOTSEER_CACHE_DIR": str(tmp_path / "b" / "cache")}
    p = subprocess.Popen([PY, "-m", "bootseer", "deps", "ensure", str(spec), "--prefix", prefix,
                          "--python", PY, "--key", r.key, "--copy"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not any(n.startswith("env.restoring-") for n in os.listdir(tmp_path)):
        assert p.poll() is None and time.time() < deadline, p.stderr.read()
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not os.path.exists(prefix)                     # nothing partial is visible
    r2 = E.ensure(str(spec), prefix, python=PY, index_urls=urls, key=r.key,
                  config=cfg(tmp_path, "c"), copy=True)
    assert r2.how == "restored" and imports(prefix) == "3"
    assert not [n for n in os.listdir(tmp_path) if n.startswith("env.restoring-")]
