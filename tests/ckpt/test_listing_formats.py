"""Checkpoint directories over HTTP from servers that list them in HTML (nginx's default
autoindex, ``python -m http.server``, Apache's page) or not at all (the checkpoint's own
metadata names its files: DCP ``.metadata``, ``model.safetensors.index.json``). Real nginx,
real http.server, a real torch DCP checkpoint."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from bootseer.ckpt.engine import Engine
from bootseer.ckpt.listing import RemoteDir, html_links
from bootseer.ckpt.prefetch import start_plan
from bootseer.config import CkptConfig, FetchConfig
from bootseer.errors import FetchError, StoreError
from bootseer.testing import servers

pytestmark = pytest.mark.timeout(60)
KiB = 1024

# nginx's root lists nothing (autoindex off: 403); /html/ gives nginx's default HTML index
HTML_INDEX = "location /html/ { autoindex on; }"


def make_tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "big.bin").write_bytes(os.urandom(300 * KiB + 7))
    (root / "sub/small.bin").write_bytes(b"tiny")
    (root / "with space.bin").write_bytes(b"spaced")
    return {"big.bin": 300 * KiB + 7, "sub/small.bin": 4, "with space.bin": 6}


def sizes(remote: RemoteDir) -> dict[str, int]:
    return {p: s.size for p, s in remote.walk().items()}


@pytest.fixture
def www(tmp_path, nginx_factory):
    root = tmp_path / "www"
    root.mkdir()
    return root, nginx_factory(root, autoindex=False, extra_locations=HTML_INDEX)


def test_nginx_default_html_autoindex(www):
    root, server = www
    want = make_tree(root / "html/ckpt")
    (root / "html/ckpt/.metadata").write_bytes(b"m")   # hidden by nginx: probed by name
    remote = RemoteDir(f"{server.url}/html/ckpt")
    assert sizes(remote) == {**want, ".metadata": 1}
    mtime = os.stat(root / "html/ckpt/big.bin").st_mtime
    assert abs(remote.attr("big.bin").mtime - mtime) < 1.5   # from Last-Modified


def test_python_http_server(tmp_path):
    root = tmp_path / "served"
    want = make_tree(root / "ckpt")
    port = servers.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                             str(port), "--directory", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        servers.wait_port(port)
        assert sizes(RemoteDir(f"http://127.0.0.1:{port}/ckpt/")) == want
    finally:
        proc.terminate()
        proc.wait(10)


APACHE_PAGE = """<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 3.2 Final//EN">
<html><head><title>Index of /ckpt</title></head><body><h1>Index of /ckpt</h1>
<table><tr><th><a href="?C=N;O=D">Name</a></th><th><a href="?C=M;O=A">Last modified</a></th>
<th><a href="?C=S;O=A">Size</a></th></tr>
<tr><td><a href="/">Parent Directory</a></td><td>&nbsp;</td><td align="right">  - </td></tr>
<tr><td><a href="__0_0.distcp">__0_0.distcp</a></td><td>2026-11-25 18:00  </td><td>1.2M</td></tr>
<tr><td><a href="shard%201.bin">shard 1.bin</a></td><td>2026-11-25 18:00  </td><td> 12K</td></tr>
<tr><td><a href="optim/">optim/</a></td><td>2026-11-25 18:00  </td><td>  - </td></tr>
<tr><td><a href="http://elsewhere.example/x">x</a></td></tr>
<tr><td><a href="../">..</a><a href="#top">top</a></td></tr>
</table></body></html>"""


def test_apache_style_index_links():
    assert html_links(APACHE_PAGE) == [("__0_0.distcp", False), ("shard 1.bin", False),
                                       ("optim", True)]


def test_links_under_the_pages_own_path():
    page = ('<a href="/">[To Parent Directory]</a><a href="/ckpt/a.bin">a.bin</a>'
            '<a href="/ckpt/sub/">sub</a><a href="/other/x.bin">x</a>'
            '<a href="/ckpt/sub/deeper.bin">deeper</a>')
    assert html_links(page, "/ckpt/") == [("a.bin", False), ("sub", True)]
    assert html_links(page) == []


@pytest.fixture
def dcp_checkpoint():
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    def save(where):
        state = {"w": torch.randn(64, 512), "b": torch.arange(3000)}
        dcp.save(state, checkpoint_id=str(where))
        return state
    return save


def test_dcp_without_any_listing(www, dcp_checkpoint, tmp_path):
    """nginx lists nothing (403): DCP's .metadata names the data files, and a plan
    prefetch streams them whole."""
    root, server = www
    dcp_checkpoint(root / "step10")
    on_disk = {p.name: p.stat().st_size for p in (root / "step10").iterdir()}
    remote = RemoteDir(f"{server.url}/step10")
    remote.check_root()
    assert sizes(remote) == on_disk
    with Engine(CkptConfig(stripe_bytes=64 * KiB, memory_budget_bytes=1024 * KiB),
                FetchConfig(retries=1, backoff_s=0.01, timeout_s=5, deadline_s=20),
                staging=str(tmp_path / "staging")) as engine:
        prefetch, kind = start_plan(engine, remote)
        prefetch.join(30)
        assert kind == "dcp" and prefetch.failed == 0


def test_safetensors_index_without_any_listing(www):
    root, server = www
    d = root / "model"
    d.mkdir()
    shards = {"model-00001-of-00002.safetensors": b"a" * 100,
              "model-00002-of-00002.safetensors": b"b" * 50}
    for name, data in shards.items():
        (d / name).write_bytes(data)
    index = json.dumps({"metadata": {}, "weight_map": {"x": "model-00001-of-00002.safetensors",
                                                       "y": "model-00002-of-00002.safetensors",
                                                       "z": "model-00001-of-00002.safetensors"}})
    (d / "model.safetensors.index.json").write_text(index)
    assert sizes(RemoteDir(f"{server.url}/model")) == {
        **{n: len(b) for n, b in shards.items()}, "model.safetensors.index.json": len(index)}


def test_no_listing_and_no_metadata_says_how_to_fix(www):
    root, server = www
    (root / "plain").mkdir()
    (root / "plain/a.bin").write_bytes(b"x")
    with pytest.raises(FetchError, match="403.*autoindex on"):
        RemoteDir(f"{server.url}/plain").check_root()


class _StorageInfo:   # named as torch's; pickled as any class is
    def __init__(self, path):
        self.relative_path, self.offset, self.length = path, 0, 1


class _Metadata:
    def __init__(self, paths):
        self.storage_data = {i: _StorageInfo(p) for i, p in enumerate(paths)}


def test_metadata_naming_a_path_outside_the_directory_is_refused(www):
    root, server = www
    (root / "evil").mkdir()
    (root / "evil/.metadata").write_bytes(pickle.dumps(_Metadata(["../secret.bin"])))
    (root / "secret.bin").write_bytes(b"s")
    with pytest.raises(StoreError, match="leaves the mounted root"):
        RemoteDir(f"{server.url}/evil").check_root()


def test_metadata_naming_a_path_outside_the_directory_is_refused_by_the_plan(tmp_path):
    """``ckpt prefetch`` plans from the same .metadata the mount lists: it refuses it in the
    same line, never skips the hostile entry quietly."""
    from bootseer.ckpt.plan import PlanError, dcp_plan, metadata_plan
    d = tmp_path / "evil"
    d.mkdir()
    (d / ".metadata").write_bytes(pickle.dumps(_Metadata(["ok.bin", "../secret.bin"])))
    with pytest.raises(StoreError, match="leaves the mounted root") as e:
        dcp_plan(str(d))
    assert not isinstance(e.value, PlanError)
    with pytest.raises(StoreError, match="leaves the mounted root"):
        metadata_plan(str(d), {".metadata": 1, "ok.bin": 1})


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_metadata_runs_nothing_when_planned(tmp_path):
    """DCP's .metadata is a pickle: the plan reads it without executing any of it."""
    from bootseer.ckpt.plan import PlanError, dcp_plan
    d = tmp_path / "hostile"
    d.mkdir()
    marker = tmp_path / "ran"
    (d / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    with pytest.raises(PlanError):
        dcp_plan(str(d))
    assert not marker.exists()


def test_dcp_plan_from_metadata_read_without_torch_classes(dcp_checkpoint, tmp_path):
    from bootseer.ckpt.plan import dcp_plan
    dcp_checkpoint(tmp_path / "ck")
    plan = dcp_plan(str(tmp_path / "ck"))
    assert {r.path for r in plan} == {"__0_0.distcp"}
    size = (tmp_path / "ck/__0_0.distcp").stat().st_size
    assert max(r.end for r in plan) == size and min(r.start for r in plan) == 0
