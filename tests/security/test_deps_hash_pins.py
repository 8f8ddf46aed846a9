"""Issue 18 item 3: a user's ``--hash`` pins constrain what ``deps ensure`` installs and
publishes (the resolver regenerated hashes from the index, so a wrong artifact was
installed and published). Real nginx index, real uv, the real CLI."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from bootseer.deps import ensure as E
from bootseer.deps.prefix import read_marker
from bootseer.deps.resolve import DepsError, keep_user_hashes
from bootseer.store import open_store
from tests.deps.test_deps import cfg, serve_index

pytestmark = pytest.mark.timeout(240)
PY = sys.executable


def ensure_cli(tmp_path, spec, prefix, urls) -> subprocess.CompletedProcess:
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "node" / "cache")}
    return subprocess.run([PY, "-m", "bootseer", "deps", "ensure", str(spec), "--prefix",
                           prefix, "--python", PY, "--index-url", urls[0], "--store",
                           str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=180, env=env)


def env_refs(tmp_path) -> list[str]:
    return sorted(open_store(str(tmp_path / "store")).list_refs("deps/env/"))


def test_a_pin_no_artifact_matches_fails_naming_it_and_touches_nothing(nginx_factory, tmp_path):
    urls, spec = serve_index(nginx_factory, tmp_path, [("bspin_one", "1.0", "X = 1\n"),
                                                       ("bspin_two", "2.0", "Y = 2\n")],
                             "bspin-one==1.0\nbspin-two==2.0\n")
    prefix = str(tmp_path / "env")
    first = ensure_cli(tmp_path, spec, prefix, urls)        # the environment a job has now
    assert first.returncode == 0, first.stderr
    key = read_marker(prefix)["key"]
    published = env_refs(tmp_path)
    pinned = tmp_path / "pinned.txt"
    pinned.write_text(f"bspin-one==1.0 \\\n    --hash=sha256:{'0' * 64}\nbspin-two==2.0\n")
    out = ensure_cli(tmp_path, pinned, prefix, urls)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bootseer: error: bspin-one==1.0"), out.stderr
    assert "pinned hash" in lines[0] and "Traceback" not in out.stderr
    assert env_refs(tmp_path) == published                  # nothing published
    assert read_marker(prefix)["key"] == key                 # the prefix is untouched
    assert not [n for n in os.listdir(tmp_path) if n.startswith("env.")
                and not n.endswith(".lock")]


def _wheel_with_tag(src, dest_dir, tag: str, body: bytes):
    """A copy of the wheel ``src`` for another tag, with another module body."""
    name = os.path.basename(src).replace("py3-none-any", tag)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest_dir / name, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith("/WHEEL"):
                data = data.replace(b"Tag: py3-none-any", f"Tag: {tag}".encode())
            elif item.filename.endswith("__init__.py"):
                data = body
            elif item.filename.endswith("/RECORD"):
                data = b""    # uv does not check RECORD hashes of a wheel it installs
            zout.writestr(item, data)
    return dest_dir / name


def test_only_the_pinned_artifact_is_installed_and_published(nginx_factory, tmp_path):
    """Two artifacts of the same version: the installer prefers the more specific one,
    but the user pinned the other, so that one (and nothing else) is installed."""
    urls, spec = serve_index(nginx_factory, tmp_path, [("bspin_one", "1.0", "X = 'generic'\n")],
                             "bspin-one==1.0\n")
    wheels = tmp_path / "index" / "wheels"
    generic = wheels / "bspin_one-1.0-py3-none-any.whl"
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-none-any"
    _wheel_with_tag(generic, wheels, tag, b"X = 'specific'\n")
    from bootseer.demo.assets import write_simple_index
    shutil.rmtree(tmp_path / "index" / "simple")
    write_simple_index(tmp_path / "index")
    spec.write_text(f"bspin-one==1.0 --hash=sha256:"
                    f"{hashlib.sha256(generic.read_bytes()).hexdigest()}\n")
    prefix = str(tmp_path / "env")
    r = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "a"))
    assert r.how == "built"
    got = subprocess.run([f"{prefix}/bin/python", "-c", "import bspin_one; print(bspin_one.X)"],
                         capture_output=True, text=True).stdout.strip()
    assert got == "generic"
    # and another node restores exactly that
    shutil.rmtree(prefix)
    r2 = E.ensure(str(spec), prefix, python=PY, index_urls=urls, config=cfg(tmp_path, "b"),
                  copy=True)    # a directory: a restore's mount would outlive the test
    assert r2.how == "restored" and r2.key == r.key


def test_keep_user_hashes_replaces_the_index_hashes_of_pinned_projects_only():
    locked = ("bspin-one==1.0 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n"
              "    # via -r req.txt\nBspin_Two==2.0 \\\n    --hash=sha256:cc\n")
    out = keep_user_hashes(locked, {"bspin-one": {"sha256:bb"}})
    assert out.splitlines() == ["bspin-one==1.0 --hash=sha256:bb",
                                "Bspin_Two==2.0 --hash=sha256:cc"]
    assert keep_user_hashes(locked, {}) == locked
    with pytest.raises(DepsError, match="Bspin_Two==2.0: no artifact"):
        keep_user_hashes(locked, {"bspin-two": {"sha256:dd"}})
    # another algorithm cannot be compared here: kept, for the installer to check
    assert "--hash=sha512:ee" in keep_user_hashes(locked, {"bspin-one": {"sha512:ee"}})
