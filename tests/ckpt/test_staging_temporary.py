"""An engine's temporary staging directory goes with it, even when nobody closes the
engine (every full test run used to leave one /tmp/bootseer-ckpt-* behind)."""

from __future__ import annotations

import os
import subprocess
import sys

from bootseer.ckpt.staging import StagingArea


def test_a_dropped_engine_leaves_no_staging_directory():
    code = "from bootseer.ckpt.engine import Engine\ne = Engine()\nprint(e.staging.dir)"
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert made.startswith("/") and not os.path.exists(made)


def test_close_removes_it_and_a_given_directory_stays(tmp_path):
    area = StagingArea.temporary()
    area.close()
    assert not area.dir.exists()
    given = StagingArea(tmp_path / "staging")
    given.close()
    assert given.dir.exists()
