"""Recording: one JSON line per event, one file per process, append-only.

File: ``<location>/<job>/<attempt>/<node>-<pid>.jsonl``, or ``<node>-<start>-<pid>.jsonl``
under ``bootseer run``, which gives each start of a node an id (``BOOTSEER_TRACE_START``):
pids repeat across starts in containers, files never do. Each event is written with one
``os.write`` of a whole line to an ``O_APPEND`` descriptor, so concurrent threads never
interleave and a crash can tear at most the last line (the reader skips and counts it).

Event fields (format version 1, see docs/trace.md): ``v, job, attempt, node, rank, gpus,
pid, kind (span|mark), phase, parent, start, end (wall clock, s), mono_start, mono_end
(monotonic, s), status (ok|failed), attrs``, and ``start_id`` when the start has one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from typing import Any

from bootseer import jobenv, redact

if __package__ == "bootseer.trace":   # in bootseer: its settings (BOOTSEER_TRACE_*, the
    from bootseer.config import trace_settings  # [trace] table of the TOML file)
else:   # the copy shipped into a job's image (run/tracing.py) imports nothing of bootseer:
    trace_settings = jobenv.trace_settings   # the variables bootseer run set for the job

FORMAT_VERSION = 1
_SECRET_KEYS = ("password", "token", "secret", "authorization", "credential")


def location_problem(location: str) -> str | None:
    """Why events cannot be recorded at ``location`` (None: they can). Events are appended
    line by line to files: a URL (s3://...) would become a local ``./s3:`` directory."""
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", location):
        return (f"trace location {redact.url(location)} is a URL: a process records to "
                f"files; 'bootseer run --trace URL' records to a spool and uploads them")
    return None


def new_start_id() -> str:
    """An id for one start of a node, in its trace file names (pids repeat across starts
    in containers)."""
    return secrets.token_hex(4)


class Recorder:
    def __init__(self, location: str | None, job: str, attempt: int, node: str,
                 rank: int | None, gpus: int, start_id: str | None = None):
        self.location, self.job, self.attempt, self.node = location, job, attempt, node
        self.rank, self.gpus = rank, gpus
        self.start_id = start_id if start_id and start_id.isalnum() else None
        bad = location and (location_problem(location) or jobenv.id_problem(job)
                            or jobenv.id_problem(node))
        if bad:   # never write outside the trace location; never fail the traced job
            print(f"bootseer: warning: not tracing: {bad}", file=sys.stderr)
            location = self.location = None
        self.enabled = bool(location)
        self._fd: int | None = None
        self._pid: int | None = None
        # the environment's trace settings this recorder was made from (recorder())
        self._key: tuple | None = None
        self._lock = threading.Lock()
        self._local = threading.local()

    @classmethod
    def from_env(cls, env=None) -> Recorder:
        env = os.environ if env is None else env
        rank = env.get("RANK") or env.get("GROUP_RANK")
        c = trace_settings(env)
        location, node = c.location, c.node or socket.gethostname()
        if "{" in node:  # e.g. "n{local_rank}": one trace node per rank on a test machine
            fields = {"rank": env.get("RANK"), "local_rank": env.get("LOCAL_RANK"),
                      "group_rank": env.get("GROUP_RANK")}
            try:
                node = node.format(**{k: v for k, v in fields.items() if v is not None})
            except (KeyError, IndexError, ValueError):
                # a process without ranks (the torchrun agent) under a per-rank node name
                # would appear as a node that never got ready: it is not traced
                location = None
        return cls(str(location) if location else None, c.job_id or "job", int(c.attempt or 0),
                   node, int(rank) if rank and rank.isdigit() else None, int(c.gpus or 0),
                   c.start)

    @property
    def path(self) -> str:
        if self.location is None:   # only an enabled recorder has a file
            raise RuntimeError("not tracing: no trace location")
        start = f"-{self.start_id}" if self.start_id else ""
        return os.path.join(self.location, self.job, str(self.attempt),
                            f"{self.node}{start}-{os.getpid()}.jsonl")

    def _open(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:  # a forked child gets its own file
            path = self.path
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._pid = pid
        return self._fd

    def write(self, event: dict) -> None:
        if not self.enabled:
            return
        line = (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode()
        try:
            with self._lock:
                os.write(self._open(), line)
        except OSError:
            self.enabled = False  # tracing must never fail the job

    def event(self, kind: str, name: str, start: float, end: float, mono_start: float,
              mono_end: float, status: str, attrs: dict, parent: str | None) -> dict:
        event = {"v": FORMAT_VERSION, "job": self.job, "attempt": self.attempt,
                 "node": self.node, "rank": self.rank, "gpus": self.gpus, "pid": os.getpid(),
                 "kind": kind, "phase": name, "parent": parent, "start": start, "end": end,
                 "mono_start": mono_start, "mono_end": mono_end, "status": status,
                 "attrs": _clean(attrs)}
        if self.start_id:
            event["start_id"] = self.start_id
        return event

    def stack(self) -> list[str]:
        s = getattr(self._local, "stack", None)
        if s is None:
            s = self._local.stack = []
        return s


def _clean(attrs: dict) -> dict:
    """Secrets out: a secret-named attribute whole, and URLs' credentials in any value (a
    checkpoint URL with ``user:password@``, a presigned query; bootseer/redact.py)."""
    return {k: ("<redacted>" if any(s in k.lower() for s in _SECRET_KEYS) else redact.value(v))
            for k, v in attrs.items()}


_recorder: Recorder | None = None
_recorder_lock = threading.Lock()


def recorder() -> Recorder:
    """The process-wide recorder, configured from the environment on first use (and again
    if the environment's trace settings changed, e.g. set by ``bootseer run``)."""
    global _recorder
    key = jobenv.trace_key()
    r = _recorder
    if r is None or r._key != key:
        with _recorder_lock:
            r = Recorder.from_env()
            r._key = key
            _recorder = r
    return r


class Span:
    __slots__ = ("name", "attrs", "start", "mono", "failed")

    def __init__(self, name: str, attrs: dict):
        self.name, self.attrs = name, attrs
        self.start, self.mono = time.time(), time.monotonic()
        self.failed = False

    def fail(self, error: str) -> None:
        """Record the phase as failed without raising (e.g. a command's non-zero exit)."""
        self.failed = True
        self.attrs["error"] = redact.text(error)[:500]   # masked whole: a cut URL is not a URL

    def set(self, **attrs: Any) -> None:
        self.attrs.update(attrs)


@contextlib.contextmanager
def phase(name: str, **attrs: Any):
    """Record the block as a phase; nested phases name their parent. An exception marks
    the phase failed (with its text) and propagates."""
    r = recorder()
    span = Span(name, attrs)
    if not r.enabled:
        yield span
        return
    stack = r.stack()
    parent = stack[-1] if stack else None
    stack.append(name)
    status = "ok"
    try:
        yield span
    except BaseException as e:
        status = "failed"
        span.attrs["error"] = redact.text(f"{type(e).__name__}: {e}")[:500]
        raise
    finally:
        stack.pop()
        r.write(r.event("span", name, span.start, time.time(), span.mono, time.monotonic(),
                        "failed" if span.failed else status, span.attrs, parent))


def mark(name: str, **attrs: Any) -> None:
    """An instant: ``ready`` (the job can train), ``rendezvous`` (for clock alignment)..."""
    r = recorder()
    if not r.enabled:
        return
    now, mono = time.time(), time.monotonic()
    stack = r.stack()
    r.write(r.event("mark", name, now, now, mono, mono, "ok", attrs, stack[-1] if stack else None))


def emit(name: str, start: float, end: float, *, status: str = "ok", **attrs: Any) -> None:
    """A finished phase with explicit wall-clock start and end (e.g. measured elsewhere)."""
    r = recorder()
    if not r.enabled:
        return
    mono = time.monotonic() - (time.time() - start)
    r.write(r.event("span", name, start, end, mono, mono + (end - start), status, attrs, None))


def traced(name: str):
    """Decorator form of :func:`phase`."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*a, **kw):
            with phase(name):
                return fn(*a, **kw)
        return inner
    return wrap
