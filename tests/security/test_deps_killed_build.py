"""Issue 18 item 7: ``deps ensure`` SIGKILLed mid-build. The build ran at PREFIX, so a
half-built environment stayed there, an orphan uv kept writing into it, and every later
ensure refused the prefix. Now the build runs beside the prefix, uv dies with the
command, and the next ensure removes the dead build's leftovers and succeeds."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time

import pytest

from bootseer.deps import ensure as E
from bootseer.deps.lease import LEASE_TTL_S
from bootseer.deps.prefix import read_marker
from tests.deps.test_deps import cfg, serve_index

pytestmark = pytest.mark.timeout(240)
PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _installers(under: str) -> list[int]:
    """uv/pip processes installing into a directory next to ``under``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "install" in argv and any(a.startswith(under) for a in argv):
            found.append(int(pid))
    return found


def _serve_metadata_apart(root) -> None:
    """PEP 658: each wheel's METADATA as ``<wheel>.metadata``, announced in the index."""
    import hashlib
    import re
    import zipfile
    for whl in (root / "wheels").glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
        (root / "wheels" / f"{whl.name}.metadata").write_bytes(meta)
        page = next((root / "simple").glob("*/index.html"))
        attr = f'data-core-metadata="sha256={hashlib.sha256(meta).hexdigest()}"'
        page.write_text(re.sub(r'<a href="([^"]*' + re.escape(whl.name) + ')',
                               lambda m, attr=attr: f'<a {attr} href="{m[1]}',
                               page.read_text()))


def test_sigkill_mid_build_leaves_no_builder_and_no_partial_prefix(nginx_factory, tmp_path):
    big = base64.b64encode(os.urandom(3 << 20)).decode()     # ~4 MB, stored uncompressed
    urls, spec = serve_index(nginx_factory, tmp_path,
                             [("bskill_big", "1.0", f"X = 1\nDATA = '{big}'\n")],
                             "bskill-big==1.0\n")
    _serve_metadata_apart(tmp_path / "index")      # resolving never downloads the wheel
    slow = nginx_factory(tmp_path / "index", limit_rate="64k")   # a minute for the wheel
    prefix = str(tmp_path / "env")
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "n1" / "cache")}
    p = subprocess.Popen([PY, "-m", "bootseer", "deps", "ensure", str(spec), "--prefix", prefix,
                          "--python", PY, "--index-url", f"{slow.url}/simple", "--store",
                          str(tmp_path / "store")], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    deadline = time.time() + 90
    while not _installers(f"{prefix}."):
        assert p.poll() is None and time.time() < deadline, p.stderr.read()
        time.sleep(0.1)
    time.sleep(1.0)                                # uv is downloading into the build
    builders = _installers(f"{prefix}.")
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.time() + 10
    while any(_alive(b) for b in builders):
        assert time.time() < deadline, f"builder {builders} outlived the killed ensure"
        time.sleep(0.05)
    assert not os.path.exists(prefix)                  # nothing partial where jobs look
    left = [n for n in os.listdir(tmp_path) if n.startswith("env.") and n != "env.lock"]
    assert any(n.startswith("env.building-") for n in left), left
    # the next ensure (the index is fast again) builds, and sweeps the dead build's leftovers
    # and at once: the dead builder's lease in the store is taken over, not waited out
    t0 = time.monotonic()
    r = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "n1"))
    assert time.monotonic() - t0 < LEASE_TTL_S / 4
    assert r.how == "built" and read_marker(prefix)["key"] == r.key
    out = subprocess.run([f"{prefix}/bin/python", "-c", "import bskill_big; print(bskill_big.X)"],
                         capture_output=True, text=True)
    assert out.stdout.strip() == "1", out.stderr
    assert [n for n in os.listdir(tmp_path) if n.startswith("env.")] == ["env.lock"]


def test_a_build_beside_the_prefix_names_the_prefix_not_its_temporary_directory(
        nginx_factory, tmp_path):
    """The venv is built in a temporary sibling and renamed: its scripts, activate and
    bytecode must name PREFIX."""
    urls, spec = serve_index(nginx_factory, tmp_path,
                             [("bsbeside", "1.0", "def main():\n    print(__file__)\n",
                               {"scripts": {"bsbeside": "bsbeside:main"}})], "bsbeside==1.0\n")
    prefix = str(tmp_path / "env")
    assert E.ensure(str(spec), prefix, python=PY, index_urls=urls,
                    config=cfg(tmp_path, "n1")).how == "built"
    assert open(f"{prefix}/bin/bsbeside").readline() == f"#!{prefix}/bin/python\n"
    assert f"VIRTUAL_ENV='{prefix}'" in open(f"{prefix}/bin/activate").read() or \
        f'VIRTUAL_ENV="{prefix}"' in open(f"{prefix}/bin/activate").read()
    found = subprocess.run(["grep", "-rl", f"{prefix}.building", prefix],
                           capture_output=True, text=True).stdout
    assert found == "", found
    out = subprocess.run([f"{prefix}/bin/bsbeside"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().startswith(f"{prefix}/lib/"), out
    import glob
    import marshal
    pyc = glob.glob(f"{prefix}/lib/python*/site-packages/bsbeside/__pycache__/*.pyc")[0]
    code = marshal.loads(open(pyc, "rb").read()[16:])
    assert code.co_filename.startswith(f"{prefix}/lib/"), code.co_filename
