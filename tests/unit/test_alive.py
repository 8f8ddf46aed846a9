"""Liveness marks (bootseer.node.alive): held while the holder lives, even when checked from the
holder's own process; a killed holder's mark reads as dead."""

from __future__ import annotations

import subprocess
import sys
import time

from bootseer.node import alive


def test_held_by_this_process_and_checking_does_not_drop_it(tmp_path):
    m = alive.Mark.new_in(tmp_path / "marks")
    assert alive.held(m.path) is True
    assert alive.held(m.path) is True   # a probe that took and closed the lock would drop it
    m.release()
    assert alive.held(m.path) is None and not m.path.exists()
    (tmp_path / "plain").touch()
    assert alive.held(tmp_path / "plain") is False


def test_a_killed_holders_mark_is_dead(tmp_path):
    path = tmp_path / "mark"
    p = subprocess.Popen([sys.executable, "-c",
                          "import sys, time; from bootseer.node import alive; "
                          f"alive.Mark({str(path)!r}); print('held', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        assert alive.held(path) is True
    finally:
        p.kill()
        p.wait(10)
    deadline = time.time() + 5
    while alive.held(path) and time.time() < deadline:
        time.sleep(0.05)
    assert alive.held(path) is False   # the file is still there; nobody holds it


def test_a_holder_in_another_pid_namespace_is_seen(tmp_path, need_root):
    """/proc/locks lists only the locks of processes visible in the reader's PID namespace:
    a check made from a container (its own /proc) must still see a host holder alive."""
    m = alive.Mark.new_in(tmp_path / "marks")
    code = ("import sys; from bootseer.node import alive; "
            f"print(alive.held({str(m.path)!r}), len(open('/proc/locks').read().split()))")
    out = subprocess.run(["unshare", "-p", "-f", "--mount-proc", sys.executable, "-c", code],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "0"], out   # the namespace shows no lock, the probe still sees it
    m.release()


def test_a_mark_is_named_only_once_locked(tmp_path):
    """No instant where a probe finds a live holder's mark unlocked: made under a dot name,
    locked, renamed; taking over a dead holder's mark replaces it."""
    path = tmp_path / "mark"
    path.write_text("left by a dead holder")
    m = alive.Mark(path)
    assert alive.held(path) is True
    assert [p.name for p in tmp_path.iterdir()] == ["mark"]
    m.release()
    assert not path.exists()


def test_a_state_dir_closed_twice_or_removed_under_it_closes_quietly(tmp_path, caplog):
    import os
    import shutil
    from pathlib import Path
    state = alive.StateDir("bsmnt-", root=str(tmp_path), sweep=False)
    (state.path / "scratch").mkdir()
    state.close()
    state.close()   # a second close finds nothing to do
    assert not state.path.exists()
    gone = alive.StateDir("bsmnt-", root=str(tmp_path), sweep=False)
    shutil.rmtree(gone.path)   # removed by someone else: the close must not raise
    gone.close()
    assert "was removed before its owner closed it" in caplog.text
    assert os.listdir(tmp_path) == [] and not Path(gone.path).exists()
