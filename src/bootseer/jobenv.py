"""The ``BOOTSEER_*`` variables a job's own processes read: the trace settings that
``bootseer run`` hands the job, the trace capture switch, and the ready file.

Part of the settings (:mod:`bootseer.config` is the one reader of the environment and
builds on this module); a module of its own because the in-job capture
(``bootseer.trace.auto``, ``bootseer.trace.record``) is shipped with it into images that
have no bootseer, to run on the image's own Python (:func:`bootseer.run.tracing.write_shim`).
So: standard library only, no bootseer import, nothing newer than the oldest Python an
image may bring.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

CONFIG_FILE = "BOOTSEER_CONFIG"
"""The settings TOML file."""
TRACE_PREFIX = "BOOTSEER_TRACE_"
TRACE_START = "BOOTSEER_TRACE_START"
"""This start's id (``bootseer run`` makes one per start): trace files never collide."""
TRACE_AUTO = "BOOTSEER_TRACE_AUTO"
"""``1``: the ``sitecustomize`` hook installs the capture in every Python process."""
READY_FILE = "BOOTSEER_READY_FILE"
"""Created by the job when it is ready (it can train)."""
WARM_MODULES = "BOOTSEER_WARM_MODULES"
"""A file the capture writes the top-level modules imported before the first collective
to (one a line): what the next start's zygote imports (docs/warm-start.md)."""
TRACE_FIELDS = ("location", "job_id", "attempt", "node", "gpus")
"""The trace settings a job inherits, each ``BOOTSEER_TRACE_<FIELD>``."""

# The job id and node name become a directory and a file name: one path component each.
_SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@+=-]{0,127}")


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a job id or node name (None: it can)."""
    if _SAFE_ID.fullmatch(value):
        return None
    return (f"{value[:80]!r} is not a trace id: letters, digits and _ . : @ + = - only "
            f"(no '/', at most 128, not starting with '.' or '-')")


def trace_var(name: str) -> str:
    """``location`` -> ``BOOTSEER_TRACE_LOCATION``."""
    return f"{TRACE_PREFIX}{name.upper()}"


@dataclass(frozen=True)
class TraceSettings:
    """Where and as what a process records its events."""
    location: str | None
    job_id: str | None
    attempt: int
    node: str | None
    gpus: int
    start: str | None


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def trace_start(env: Mapping[str, str] | None = None) -> str | None:
    """This start's id, when ``bootseer run`` gave it one."""
    return _env(env).get(TRACE_START)


def trace_settings(env: Mapping[str, str] | None = None) -> TraceSettings:
    """The trace settings as the variables give them, without the TOML file (a job under
    ``bootseer run`` inherits every one it needs); a number that is not one reads as 0."""
    env = _env(env)
    try:
        attempt = int(env.get(trace_var("attempt")) or 0)
        gpus = int(env.get(trace_var("gpus")) or 0)
    except ValueError:
        attempt, gpus = 0, 0
    return TraceSettings(location=env.get(trace_var("location")),
                         job_id=env.get(trace_var("job_id")), attempt=attempt,
                         node=env.get(trace_var("node")), gpus=gpus, start=trace_start(env))


def trace_key(env: Mapping[str, str] | None = None) -> tuple:
    """What the process-wide recorder depends on: when it changes (``bootseer run`` sets
    the trace settings after start-up; a warm worker forked from a zygote takes its own
    RANK), the recorder is made again."""
    env = _env(env)
    return tuple(env.get(name) for name in (
        trace_var("location"), trace_var("job_id"), trace_var("attempt"), trace_var("node"),
        TRACE_START, CONFIG_FILE, "RANK", "GROUP_RANK"))


def capture_on(env: Mapping[str, str] | None = None) -> bool:
    """Whether the ``sitecustomize`` hook installs the capture in this process."""
    return _env(env).get(TRACE_AUTO) == "1"


def ready_file(env: Mapping[str, str] | None = None) -> str | None:
    """The file that says the job is ready, when ``bootseer run`` named one."""
    return _env(env).get(READY_FILE)
