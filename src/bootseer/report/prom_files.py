"""Keep node_exporter's textfile directory bounded: every job's ``bootseer report --prom``
file carries that job's ``job_id`` label, so files left behind would grow the series set
without end. ``prune`` removes the bootseer files (recognised by their first line, never
another exporter's) last written more than an age ago."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from bootseer.errors import UsageError

# export_prom.text always starts with this family: the mark of a file bootseer wrote
MARK = b"# HELP bootseer_startup_restarts "
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(value: str) -> float:
    """``"7d"``, ``"24h"``, ``"90m"``, ``"3600"`` / ``"3600s"`` -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", value)
    if not m or float(m.group(1)) <= 0:
        e = UsageError(f"age {value!r} is not a positive duration")
        e.hint = "give a number with a unit: 3600s, 90m, 24h, 7d"
        raise e
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def prune(directory: Path, max_age_s: float, *, keep: Path | None = None,
          now: float | None = None) -> list[Path]:
    """Remove bootseer's ``*.prom`` files in ``directory`` older than ``max_age_s``
    (modification time); ``keep`` (the file just written) stays. Returns what went."""
    cutoff = (time.time() if now is None else now) - max_age_s
    gone = []
    for path in sorted(directory.glob("*.prom")):
        if keep is not None and path.resolve() == keep.resolve():
            continue
        try:
            st = path.lstat()
            if not path.is_file() or path.is_symlink() or st.st_mtime >= cutoff:
                continue
            with open(path, "rb") as f:
                if f.read(len(MARK)) != MARK:
                    continue
            os.unlink(path)
        except FileNotFoundError:
            continue    # another prune (a second job ending on this node) got there first
        gone.append(path)
    return gone
