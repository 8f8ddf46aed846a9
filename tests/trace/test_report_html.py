"""The HTML report in a real browser (Debian's chromium, headless): it renders with no
error, draws the swim lanes, legends, CDF and the attempts' comparison, and outlines the
gating phase on the gating node where the text report says."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import need
from tests.trace.report_traces import demo_node

pytestmark = pytest.mark.timeout(180)
LABEL_W, W = 190, 1180          # the lanes' geometry in export_html.js


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
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text)
    assert "'report-data'" in text


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    need(exe is not None, "chromium is not installed (scripts/setup.sh installs it)")
    return exe


def _browser(exe: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                           "--no-first-run", "--enable-logging=stderr", "--v=0",
                           "--virtual-time-budget=10000", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_renders_in_a_browser(report, tmp_path):
    exe = _chromium()
    page, stdout = report
    r = _browser(exe, "--dump-dom", page.as_uri())
    dom = r.stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-rendered="1"' in body and "data-error" not in body, body
    assert not re.search(r"Uncaught|CONSOLE.*[Ee]rror", r.stderr), r.stderr[-2000:]
    # swim lanes for every node of both attempts, one row per pipeline track
    for attempt in (0, 1):
        lanes = re.search(rf"<div id=\"lanes-{attempt}\"[^>]*>(.*?)</div>", dom, re.S).group(1)
        labels = set(re.findall(r'<text class="lane"[^>]*>([^<]+)</text>', lanes))
        assert {"image", "deps", "deps (2)", "startup"} <= labels
        assert lanes.count('class="span') >= 3 * 14
        assert re.search(rf'<div id="cdf-{attempt}"[^>]*>.*?class="cdf"', dom, re.S)
    legend = re.search(r'<div id="legend-phases"[^>]*>(.*?)</div>', dom, re.S).group(1)
    keys = re.findall(r'<i style="background:([^"]+)"></i>([^<]+)</span>', legend)
    assert {"image.lazy", "deps.restore", "train.first_step"} <= {k for _, k in keys}
    assert len({c for c, _ in keys}) == len(keys)          # no two phases share a colour
    compare = re.search(r'<div id="compare"[^>]*>(.*?)</div>', dom, re.S).group(1)
    assert "baseline attempt 0" in compare and "attempt 1" in compare
    # the gating phase is outlined on the gating node, at its place on the time axis
    node, phase = re.search(r"attempt 0:.*?\n  gated by node (\S+?)(?: \(rank \d+ last\))?, "
                            r"phase (\S+)", stdout, re.S).groups()
    assert (node, phase) == ("n2", "image.lazy")
    lanes0 = re.search(r'<div id="lanes-0"[^>]*>(.*?)</div>', dom, re.S).group(1)
    (gate,) = re.findall(r'<rect class="span gating"[^>]*>', lanes0)
    assert f'data-phase="{phase}"' in gate and f'data-node="{node}"' in gate
    data = json.loads(re.search(r"<script type=\"application/json\" id=\"report-data\">"
                                r"(.*?)</script>", dom, re.S).group(1))
    end = data["attempts"][0]["end"]
    x, w = (float(re.search(rf' {k}="([\d.]+)"', gate).group(1)) for k in ("x", "width"))
    right = W - 10
    assert x == pytest.approx(LABEL_W + (right - LABEL_W) * 0.001 / end, abs=1.0)
    assert x + w == pytest.approx(LABEL_W + (right - LABEL_W) * 6.0 / end, abs=1.0)
    first_node = re.search(r'<text class="node gating-node"[^>]*>([^<]+)', lanes0).group(1)
    assert first_node.startswith(node)
    shot = tmp_path / "report.png"
    _browser(exe, f"--screenshot={shot}", "--window-size=1400,2400", page.as_uri())
    assert shot.stat().st_size > 10_000
