"""Issue 18 item 13 (deps): a read-only store (a read-only NFS export, a mirror) is a
normal case. ``deps ensure`` restores what it holds; on a miss it installs on the node
without publishing, with one warning line (it ended in a traceback: the lease could not
be written). The store is a real read-only bind mount in a private mount namespace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from bootseer.deps import ensure as E
from bootseer.deps.prefix import read_marker, rmtree
from tests.deps.test_deps import cfg, serve_index

pytestmark = pytest.mark.timeout(240)
PY = sys.executable


def files_of(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root)
                  for d, _, names in os.walk(root) for n in names)


def ensure_on_read_only_store(tmp_path, spec, prefix, urls, *extra) -> subprocess.CompletedProcess:
    store = tmp_path / "store"
    cmd = (f"mount --bind -o ro {store} {store} && exec {PY} -m bootseer deps ensure {spec} "
           f"--prefix {prefix} --python {PY} --index-url {urls[0]} --store {store} "
           + " ".join(extra))
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "ro-node" / "cache")}
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", cmd],
                          capture_output=True, text=True, timeout=180, env=env)


def test_read_only_store_restores_and_installs_without_publishing(nginx_factory, tmp_path,
                                                                   need_root):
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is required")
    urls, spec = serve_index(nginx_factory, tmp_path, [("bsro_one", "1.0", "X = 1\n"),
                                                       ("bsro_two", "1.0", "Y = 2\n")],
                             "bsro-one==1.0\n")
    prefix = str(tmp_path / "env")
    built = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "a"))
    rmtree(prefix)
    before = files_of(tmp_path / "store")
    # a hit: restored from the read-only store, nothing said (--copy: a mount would end
    # with the command's private mount namespace, and the prefix is read after it)
    hit = ensure_on_read_only_store(tmp_path, spec, prefix, urls, "--key", built.key, "--copy")
    assert hit.returncode == 0 and hit.stdout.split()[0] == "restored", hit.stderr
    assert hit.stderr == ""
    assert read_marker(prefix)["key"] == built.key
    # a miss: installed here, one warning line, nothing written to the store
    other = tmp_path / "other.txt"
    other.write_text("bsro-one==1.0\nbsro-two==1.0\n")
    miss = ensure_on_read_only_store(tmp_path, other, str(tmp_path / "env2"), urls)
    assert miss.returncode == 0 and miss.stdout.split()[0] == "installed", miss.stderr
    lines = miss.stderr.strip().splitlines()
    assert len(lines) == 1 and "read-only" in lines[0] and "without publishing" in lines[0], \
        miss.stderr
    assert "WARNING" in lines[0] and "Traceback" not in miss.stderr
    assert files_of(tmp_path / "store") == before
    out = subprocess.run([f"{tmp_path}/env2/bin/python", "-c", "import bsro_one, bsro_two"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
