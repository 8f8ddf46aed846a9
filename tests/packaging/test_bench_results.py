"""Every benchmark writes through bench/outdir.py, which makes the results directory:
``bench/results/`` is ignored by git, so a fresh clone has none (bench/scale once ended a
whole run with a traceback there). Also bench/image's judges of a hot set: the page-cache
residency it reads with mincore(2) and the profile's hot bytes."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    """A bench module under a name of its own (bench/ is no package; its module names
    are too plain to put on sys.path for the whole test session)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


outdir = _load("bench_outdir", ROOT / "bench/outdir.py")
local = _load("bench_image_local", ROOT / "bench/image/local.py")

BENCHES = sorted((ROOT / "bench").glob("*/run.py"))


def test_the_writer_makes_the_results_directory_of_a_fresh_clone(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOTSEER_BENCH_RESULTS", str(tmp_path / "clone/bench/results"))
    p = outdir.write_json("image.json", {"runs": {}})
    assert p == tmp_path / "clone/bench/results/image.json" and p.read_text().startswith("{")
    assert outdir.path("e2e", is_dir=True).is_dir()
    assert outdir.path("deps.log").parent.is_dir()
    # an absolute path (bench/store --json) is kept, its directory made
    assert outdir.write_json(tmp_path / "else/x.json", []).parent == tmp_path / "else"


@pytest.mark.parametrize("run", BENCHES, ids=lambda p: p.parent.name)
def test_each_bench_writes_its_results_through_the_writer(run):
    text = run.read_text()
    # a results path made by hand would skip the mkdir: only outdir names the directory
    assert not re.search(r"""["']bench/results|/\s*["']results["']""", text), run
    if "results" in text.replace('"""', "").split("from __future__")[-1]:
        assert "outdir." in text, f"{run} mentions results but never writes through outdir"


def test_mincore_residency_follows_the_page_cache(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(os.urandom(3 << 20) + b"tail")   # the last page is short
    size = f.stat().st_size
    local.evict(tmp_path)
    assert local.resident_bytes(str(f), size) == 0
    with open(f, "rb") as r:
        os.posix_fadvise(r.fileno(), 0, 0, os.POSIX_FADV_RANDOM)   # no read-ahead
        r.seek(1 << 20)
        r.read(100)
        r.seek(size - 2)
        r.read()
    got = local.resident_bytes(str(f), size)
    assert local.PAGE + 4 <= got <= 2 * local.PAGE + 4, got   # the touched page and the tail
    assert local.residency(tmp_path) == {"resident_bytes": got, "files": 1, "files_touched": 1,
                                         "bytes": size}


def test_hot_bytes_counts_whole_chunks_and_the_blocks_read():
    mib = 1 << 20
    p = {"chunks": [["sha256:a", 0.1, 1, "/lib/a.so", mib], ["sha256:b", 0.2, 1, "/m", 1000]]}
    assert local.hot_bytes(p) == {"hot_chunks": 2, "hot_bytes": mib + 1000}
    p |= {"block_size": 64 << 10, "blocks": {"sha256:a": [0, 3, 15]}}   # b: whole
    assert local.hot_bytes(p)["hot_block_bytes"] == 3 * (64 << 10) + 1000
    p["blocks"] = {"sha256:b": [0]}   # a short chunk's only block counts its bytes
    assert local.hot_bytes(p)["hot_block_bytes"] == mib + 1000
