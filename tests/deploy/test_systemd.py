"""The host-service units in deploy/systemd pass ``systemd-analyze verify`` (unknown keys,
bad values, a missing executable all fail it) and keep the settings running jobs rely on."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import need

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
INSTALLED = "/usr/local/bin/bootseer"


def _bootseer() -> str:
    return shutil.which("bootseer") or str(Path(sys.executable).with_name("bootseer"))


def test_units_verify(tmp_path):
    need(shutil.which("systemd-analyze") is not None, "systemd is not installed")
    exe = _bootseer()
    need(Path(exe).exists(), "the bootseer command is not installed")
    names = sorted(p.name for p in UNITS.iterdir())
    assert names == ["bootseer-gc.service", "bootseer-gc.timer", "bootseer-snapshotter.service"]
    for name in names:
        # the units name where `pip install` puts the command on a node; here, this venv's
        text = (UNITS / name).read_text()
        assert INSTALLED in text or name.endswith(".timer")
        (tmp_path / name).write_text(text.replace(INSTALLED, exe))
    r = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / n) for n in names)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    assert not r.stdout.strip(), r.stdout


def test_a_restart_never_kills_what_serves_running_containers():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment, method-assign]
    unit.read(UNITS / "bootseer-snapshotter.service")
    assert unit["Service"]["KillMode"] == "process"
    assert unit["Service"]["Restart"] == "always"
    assert unit["Unit"]["Before"] == "containerd.service"
    # containerd must start without it: the runtime handler keeps system pods on overlayfs
    assert "Requires" not in unit["Unit"] and "BindsTo" not in unit["Unit"]
    assert unit["Service"]["RuntimeDirectoryPreserve"] == "yes"
    timer = configparser.ConfigParser(interpolation=None)
    timer.read(UNITS / "bootseer-gc.timer")
    assert timer["Timer"]["Persistent"] == "true"
