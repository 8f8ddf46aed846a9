"""The demo/bench bookkeeping of zygotes kept between starts: a node set's kept zygotes
(their records in its warm directories) are spared by the sweep with their descendants,
and stopped by their PIDs, so nothing is left running after the bench."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from bootseer.demo import scenario as S
from bootseer.run import warmkeep


def _kept(work: Path, node_set: str, node: str) -> subprocess.Popen:
    """A process standing for a kept zygote: its command names its state directory (as
    the zygote's ``unshare`` does), with a child of its own; its record where the run
    writes it."""
    host = S.warm_dir(work, node_set) / node / "image-x"
    state = host / "ct-1"
    state.mkdir(parents=True)
    proc = subprocess.Popen(["sh", "-c", f": {state}; sleep 60 & wait"],
                            start_new_session=True)
    (host / warmkeep.RECORD).write_text(json.dumps({"pid": proc.pid, "state": str(state)}))
    return proc


def _children(pid: int) -> list[int]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                found = [int(c) for c in f.read().split()]
        except OSError:
            return []
        if found:
            return found
        time.sleep(0.02)
    return []


def test_kept_zygotes_are_spared_then_stopped_by_pid(tmp_path):
    a, b = _kept(tmp_path, "2nd-warm", "n0"), _kept(tmp_path, "shared", "n0")
    try:
        child = _children(a.pid)
        assert child, "the stand-in's child did not start"
        spared = S.kept_pids(tmp_path, "2nd-warm")
        assert {a.pid, *child} <= spared and b.pid not in spared
        assert S.stop_kept(tmp_path, "2nd-warm") == 1
        assert a.wait(10) is not None
        assert b.poll() is None, "another node set's zygote was stopped"
        # its state directory (named in its command) went with it
        assert not (S.warm_dir(tmp_path, "2nd-warm") / "n0" / "image-x" / "ct-1").exists()
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()
        for pid in child:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_a_reused_pid_is_not_stopped(tmp_path):
    """A record whose PID now belongs to another process (its command does not name the
    state directory) stops nothing."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        host = S.warm_dir(tmp_path, "set") / "n0" / "image-x"
        host.mkdir(parents=True)
        (host / warmkeep.RECORD).write_text(json.dumps(
            {"pid": other.pid, "state": str(host / "ct-gone")}))
        assert S.stop_kept(tmp_path, "set") == 0
        time.sleep(0.2)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
