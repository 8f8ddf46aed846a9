"""Per-job Prometheus textfiles do not pile up: ``bootseer report --prom DIR/JOB.prom
--prom-max-age AGE`` removes bootseer's files in DIR older than AGE, never another
exporter's file nor the one just written."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bootseer.errors import UsageError
from bootseer.report import prom_files
from tests.trace.test_report_exports import two_attempts  # noqa: F401 - a fixture

OURS = prom_files.MARK.decode() + "Restarts of the job seen in its trace.\n"


def _aged(path, text: str, age_s: float):
    path.write_text(text)
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


def test_prune_removes_only_old_bootseer_files(tmp_path):
    old = _aged(tmp_path / "job-1.prom", OURS, 3 * 86400)
    fresh = _aged(tmp_path / "job-2.prom", OURS, 60)
    other = _aged(tmp_path / "node.prom", "# HELP node_thing x\n", 3 * 86400)
    kept = _aged(tmp_path / "job-3.prom", OURS, 3 * 86400)
    not_prom = _aged(tmp_path / "job-4.txt", OURS, 3 * 86400)
    (tmp_path / "link.prom").symlink_to(other)
    assert prom_files.prune(tmp_path, 86400, keep=kept) == [old]
    assert {p.name for p in tmp_path.iterdir()} == {
        fresh.name, other.name, kept.name, not_prom.name, "link.prom"}


@pytest.mark.parametrize("value, seconds", [("7d", 7 * 86400), ("24h", 86400), ("90m", 5400),
                                            ("3600", 3600), ("30s", 30)])
def test_ages(value, seconds):
    assert prom_files.parse_age(value) == seconds


@pytest.mark.parametrize("value", ["", "0", "-1h", "7w", "h", "1e3"])
def test_a_bad_age_is_one_line_with_a_hint(value):
    with pytest.raises(UsageError) as e:
        prom_files.parse_age(value)
    assert "\n" not in str(e.value) and e.value.hint


def test_report_prunes_the_textfile_directory_it_writes(two_attempts, tmp_path):  # noqa: F811
    d = tmp_path / "textfiles"
    d.mkdir()
    old = _aged(d / "finished.prom", OURS, 2 * 86400)
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(two_attempts),
                        "--prom", str(d / "now.prom"), "--prom-max-age", "1d"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in d.iterdir()) == ["now.prom"] and not old.exists()
    assert (d / "now.prom").read_bytes().startswith(prom_files.MARK)
    r = subprocess.run([sys.executable, "-m", "bootseer", "report", str(two_attempts),
                        "--prom-max-age", "1d"], capture_output=True, text=True)
    assert r.returncode == 2 and "--prom-max-age" in r.stderr and "hint:" in r.stderr
