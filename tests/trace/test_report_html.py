"""The HTML report in a real browser (Debian's chromium, headless): it renders with no
error, draws the swim lanes, legends, CDF and the attempts' comparison, and outlines the
gating phase on the gating node where the text report says."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import need
from tests.trace.report_traces import demo_node

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def report(tmp_path):
    rendezvous = 6.05 + 0.05 + 0.2 + 3.0 + 0.5
    for attempt in (0, 1):
        for i in range(3):
            demo_node(tmp_path / "t", f"n{i}", rank=i, attempt=attempt,
                      image_s=(6.0 if i == 2 else 4.0) if attempt == 0 else 3.0,
                      rendezvous_at=rendezvous if attempt == 0 else None).write()
    demo_node(tmp_path / "base", "n0", image_s=30.0).write()
    page = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "t" / "job"),
                        "--baseline", str(tmp_path / "base" / "job"), "--html", str(page)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return page, r.stdout


def test_page_is_self_contained(report):
    page, _ = report
    text = page.read_text()
    assert "<script src" not in text and "<link" not in text
    # nothing loaded from a network: no src/href/url() to a host (uPlot's banner names its
    # repository in a comment)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//""",
                         text)
    assert "'report-data'" in text and "uPlot" in text
    # the version the page names is the one vendored (its banner)
    from bootseer.report.export_html import UPLOT_VERSION, VENDOR
    assert f"uPlot {UPLOT_VERSION}" in text
    assert f"(v{UPLOT_VERSION})" in (VENDOR / "uPlot.iife.min.js").read_text()


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    need(exe is not None, "chromium is not installed (scripts/setup.sh installs it)")
    return exe


def _browser(exe: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                           "--no-first-run", "--enable-logging=stderr", "--v=0",
                           "--virtual-time-budget=10000", *args],
                          capture_output=True, text=True, timeout=120)


def _geometry(dom: str, chart: str) -> dict:
    """What the chart in ``<div id=chart>`` drew (export_html.js's data-geometry)."""
    attr = re.search(rf'<div id="{chart}"[^>]*?data-geometry="([^"]*)"', dom)
    assert attr, f"{chart} drew nothing"
    return json.loads(html.unescape(attr.group(1)))


@pytest.mark.slow
def test_report_renders_in_a_browser(report, tmp_path):
    exe = _chromium()
    page, stdout = report
    r = _browser(exe, "--dump-dom", page.as_uri())
    dom = r.stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-rendered="1"' in body and "data-error" not in body, body
    assert re.search(r'data-rendered-ms="\d+"', body), body     # what bench/trace reads
    assert not re.search(r"Uncaught|CONSOLE.*[Ee]rror", r.stderr), r.stderr[-2000:]
    assert dom.count('class="uplot') >= 2 * 3 + 1     # uPlot drew every chart
    # swim lanes for every node of both attempts, one row per pipeline track
    for attempt in (0, 1):
        lanes = _geometry(dom, f"lanes-{attempt}")
        assert {"image", "deps", "deps (2)", "startup"} <= set(lanes["rows"])
        assert len(lanes["rects"]) >= 3 * 14
        assert {"n0", "n1", "n2"} == {x["node"] for x in lanes["rects"]}
        cdf = _geometry(dom, f"cdf-{attempt}")
        assert {"time to ready", "image.lazy"} <= set(cdf["series"])
        assert cdf["plot"]["width"] > 500
    legend = re.search(r'<div id="legend-phases"[^>]*>(.*?)</div>', dom, re.S).group(1)
    keys = re.findall(r'<i style="background:([^"]+)"></i>([^<]+)</span>', legend)
    assert {"image.lazy", "deps.restore", "train.first_step"} <= {k for _, k in keys}
    assert len({c for c, _ in keys}) == len(keys)          # no two phases share a colour
    compare = _geometry(dom, "compare")
    assert compare["rows"] == ["baseline attempt 0", "attempt 0", "attempt 1"]
    assert {x["pipeline"] for x in compare["rects"]} >= {"image", "job", "ckpt"}
    # the gating phase is outlined on the gating node, at its place on the time axis
    node, phase = re.search(r"attempt 0:.*?\n  gated by node (\S+?)(?: \(rank \d+ last\))?, "
                            r"phase (\S+)", stdout, re.S).groups()
    assert (node, phase) == ("n2", "image.lazy")
    lanes0 = _geometry(dom, "lanes-0")
    (gate,) = [x for x in lanes0["rects"] if x["gating"]]
    assert (gate["node"], gate["phase"]) == (node, phase)
    plot = lanes0["plot"]
    lo, hi = plot["x"]
    px = plot["width"] / (hi - lo)                          # CSS pixels per second
    assert gate["x"] == pytest.approx((0.001 - lo) * px, abs=1.0)
    assert gate["x"] + gate["w"] == pytest.approx((6.0 - lo) * px, abs=1.0)
    # on the gating node's image row: the first node drawn, its label naming it gating
    assert lanes0["rows"][0].startswith(f"{node} \u25c0 gating")
    image_row = lanes0["rows"].index("image")
    row_h = plot["height"] / len(lanes0["rows"])
    assert image_row * row_h <= gate["y"] < (image_row + 1) * row_h
    shot = tmp_path / "report.png"
    _browser(exe, f"--screenshot={shot}", "--window-size=1400,2400", page.as_uri())
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


@pytest.mark.slow
def test_bytes_by_source_in_the_page(tmp_path):
    """The job's bytes from the origin and from peers per pipeline, the lanes' nodes' in a
    table and in the tooltip of each node's row."""
    from tests.trace.test_report_sources import _peers_job
    exe = _chromium()
    _peers_job(tmp_path / "t")
    page = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(tmp_path / "t" / "job"),
                        "--html", str(page)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = _browser(exe, "--dump-dom", page.as_uri())
    dom = r.stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-rendered="1"' in body and "data-error" not in body, body
    assert not re.search(r"Uncaught|CONSOLE.*[Ee]rror", r.stderr), r.stderr[-2000:]
    section = dom.split("id=\"sources-0\"")[1].split("<h3")[0]
    tables = re.findall(r"<table>(.*?)</table>", section, re.S)
    assert len(tables) == 2
    rows = [[html.unescape(c) for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", tr)]
            for tr in re.findall(r"<tr>(.*?)</tr>", tables[0])]
    assert rows[0][:4] == ["pipeline", "origin MiB", "peers MiB", "from peers"]
    assert rows[1] == ["image", "71.0", "127", "64 %", "3", "maker 1, peer 2"]
    assert rows[-1][:4] == ["all", "321", "600", "65 %"]
    per_node = [[html.unescape(c) for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", tr)]
                for tr in re.findall(r"<tr>(.*?)</tr>", tables[1])]
    assert per_node[0][:3] == ["node", "image origin MiB", "image peers MiB"]
    by_node = {row[0].split()[0]: row for row in per_node[1:]}
    assert set(by_node) == {"n0", "n1", "n2"}
    assert by_node["n1"][1:7] == ["2.0", "64.0", "1.0", "40.0", "0.0", "200"]
    assert by_node["n0"][0] == "n0 (most from the origin)"
    # each node's row in the swim lanes carries its bytes as a tooltip
    lanes = _geometry(dom, "lanes-0")
    pairs = zip(lanes["rows"], lanes["rowTips"], strict=True)
    tips = {row.split()[0]: tip for row, tip in pairs if tip}
    assert set(tips) == {"n0", "n1", "n2"}
    assert "image: 2.0 MiB origin, 64.0 MiB peers (peer)" in tips["n1"]
