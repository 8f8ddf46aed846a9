"""Reading traces: every ``*.jsonl`` under a directory, one event per line; torn or
garbage lines are skipped and counted, never fatal, and the first few are named
(``<file>:<line>: why``) among the trace's problems. A line holding two JSON values is
one bad line, not two events; a torn last line (a node killed mid-write) costs only
itself; blank lines are nothing.

A trace directory is input from many writers, so the reader trusts nothing in it: only
regular files are read (a FIFO would block forever, a link to ``/dev/zero`` would be read
until memory runs out), a line longer than :data:`MAX_LINE` is skipped without being held,
and an event whose numbers are NaN, infinite or out of range is rejected (it would turn
totals into ``-inf`` or raise in the report). Each is counted and reported."""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bootseer.errors import BootseerError, TraceError

REQUIRED = ("job", "attempt", "node", "phase", "start", "end")
MAX_LINE = 1 << 20        # bytes: an event is well under 10 KiB
MAX_SECONDS = 1e11        # |time| in seconds: year 5138 on the wall clock
MAX_INT = 1 << 63         # counts, bytes, ranks
_NUMBER = (int, float)
NAMED_BAD_LINES = 10      # a trace of 10,000 torn files is not 10,000 warnings


@dataclass
class Trace:
    events: list[dict] = field(default_factory=list)
    skipped_lines: int = 0
    duplicates: int = 0
    files: int = 0
    problems: list[str] = field(default_factory=list)
    skipped_files: int = 0
    """Trace files that are not regular files (FIFO, device, symlink): never opened."""
    long_lines: int = 0
    """Lines over MAX_LINE bytes (also in ``skipped_lines``)."""
    rejected: int = 0
    """Events with NaN, infinite or out-of-range numbers (also in ``skipped_lines``)."""
    jobs: set = field(default_factory=set)
    """The jobs the events belong to (one, unless files of several were mixed)."""
    bad_lines: list[str] = field(default_factory=list)
    """``<file>:<line>: why`` of the first :data:`NAMED_BAD_LINES` skipped lines."""

    def skip(self, where: str, lineno: int, why: str) -> None:
        self.skipped_lines += 1
        if len(self.bad_lines) < NAMED_BAD_LINES:
            self.bad_lines.append(f"{where}:{lineno}: {why}; skipped")


def open_regular(path: str | os.PathLike, *, follow: bool = False) -> int | None:
    """A read descriptor of ``path`` if it is a regular file, else None (also when it
    cannot be opened). Symlinks are refused unless ``follow``; a FIFO is opened without
    blocking and then refused."""
    opened = _open_sized(path, follow)
    return None if opened is None else opened[0]


def _open_sized(path: str | os.PathLike, follow: bool) -> tuple[int, int] | None:
    """:func:`open_regular`, with the file's size (one fstat for both)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd, st.st_size


def read_lines(fd: int, max_line: int = MAX_LINE) -> tuple[list[bytes], int]:
    """The non-blank lines of an open file, and how many were longer than ``max_line``
    (skipped, never held whole). Closes ``fd``."""
    numbered, long_at, _ = numbered_lines(fd, max_line)
    return [raw for _, raw in numbered], len(long_at)


def numbered_lines(fd: int, max_line: int = MAX_LINE
                   ) -> tuple[list[tuple[int, bytes]], list[int], int | None]:
    """The non-blank lines of an open file with their numbers (from 1), the numbers of the
    lines longer than ``max_line`` (skipped, never held whole), and the number of a last
    line without an end of line (torn, if it does not parse), else None. Closes ``fd``."""
    lines: list[tuple[int, bytes]] = []
    long_at: list[int] = []
    tail, in_long, lineno = b"", False, 0
    try:   # os.read, not a file object: one per trace file of a 10,000-node job
        while chunk := os.read(fd, 1 << 20):
            parts = (tail + chunk).split(b"\n")
            tail = parts.pop()
            for part in parts:
                lineno += 1
                if in_long or len(part) > max_line:
                    long_at.append(lineno)
                    in_long = False
                elif part.strip():
                    lines.append((lineno, part))
            if len(tail) > max_line:   # drop the long line's bytes as they come
                tail, in_long = b"", True
    finally:
        os.close(fd)
    unterminated = lineno + 1 if in_long or tail.strip() else None
    if in_long or len(tail) > max_line:
        long_at.append(lineno + 1)
    elif tail.strip():
        lines.append((lineno + 1, tail))
    return lines, long_at, unterminated


class NotFinite(BootseerError, ValueError):
    """A trace line holds NaN or Infinity: the line is rejected, never shown."""


def reject_constant(name: str):
    """``json.loads(..., parse_constant=reject_constant)``: NaN and Infinity refused."""
    raise NotFinite(f"{name} is not a number")


# one decoder for every file (json.loads with an argument builds one per call)
_DECODER = json.JSONDecoder(parse_constant=reject_constant)
_GOOD, _MALFORMED, _OUT_OF_RANGE = 0, 1, 2


def _decoded(raw: bytes):
    """One line's event, or None if it is not JSON; _OUT_OF_RANGE for NaN or Infinity."""
    try:
        return json.loads(raw, parse_constant=reject_constant)
    except NotFinite:
        return _OUT_OF_RANGE
    except (ValueError, RecursionError):
        return None


# The event schema, written once: field -> (types it may have, required). ``None`` is
# allowed wherever a field is optional; a bool is never a number here (JSON true is not a
# count). Unknown fields are kept and never read.
_STR, _INT, _NUM = (str,), (int,), (int, float)
SCHEMA: dict[str, tuple[tuple[type, ...], bool]] = {
    "job": ((str, int), True), "attempt": (_INT, True), "node": ((str, int), True),
    "phase": (_STR, True), "start": (_NUM, True), "end": (_NUM, True),
    "v": (_INT, False), "rank": (_INT, False), "gpus": (_INT, False), "pid": (_INT, False),
    "kind": (_STR, False), "parent": (_STR, False), "status": (_STR, False),
    "start_id": (_STR, False), "mono_start": (_NUM, False), "mono_end": (_NUM, False),
    "attrs": ((dict,), False),
}
_TIMES = ("start", "end", "mono_start", "mono_end")
_INTS = ("attempt", "rank", "gpus", "pid", "v")
_REQUIRED = tuple(name for name, (_, required) in SCHEMA.items() if required)
# field -> (types, the bound of its absolute value, or None): SCHEMA and the ranges above
# in one lookup per field of an event
_FIELDS: dict[str, tuple[tuple[type, ...], float | None]] = {
    name: (types, MAX_SECONDS if name in _TIMES else MAX_INT if name in _INTS else None)
    for name, (types, _) in SCHEMA.items()}


def _check(ev) -> int:
    """_GOOD, _MALFORMED (not an event: a field missing or of the wrong type, by
    :data:`SCHEMA`) or _OUT_OF_RANGE (a number NaN, infinite or out of range: times,
    counts, flat attributes). Runs once per event of a 10,000-node trace: one pass over
    the event's own fields, locals, no generators."""
    if type(ev) is not dict:
        return _OUT_OF_RANGE if ev is _OUT_OF_RANGE else _MALFORMED
    get = ev.get
    for name in _REQUIRED:
        if get(name) is None:
            return _MALFORMED
    out = False   # a wrong type anywhere makes the event malformed, whatever else it has
    fields = _FIELDS.get
    for name, v in ev.items():
        spec = fields(name)
        if spec is None or v is None:
            continue
        if type(v) not in spec[0]:
            return _MALFORMED
        bound = spec[1]
        # `not <` is also true for NaN
        if bound is not None and not -bound < v < bound:
            out = True
    if out:
        return _OUT_OF_RANGE
    attrs = get("attrs")
    if attrs:
        for v in attrs.values():
            if (type(v) is float and not math.isfinite(v)) or \
                    (type(v) is int and not -MAX_INT < v < MAX_INT):
                return _OUT_OF_RANGE
    return _GOOD


def _decode_joined(lines: bytes, count: int) -> list | None:
    """``count`` lines (joined by newlines) decoded at once, as the items of one array
    (one decode per file is ~3x faster than one per line); None unless each line is one
    JSON value: a line of two (``{..}, {..}``) gives one item too many. (A line of two
    and a value split over two lines would balance out: no writer of traces breaks an
    event's line.)"""
    try:
        values = _DECODER.decode(b"".join((b"[", lines.replace(b"\n", b","), b"]")).decode())
    except (ValueError, RecursionError):   # (UnicodeDecodeError is a ValueError)
        return None
    return values if len(values) == count else None


def _read_small(fd: int, size: int) -> tuple[list, int] | None:
    """The events of a file (``size`` bytes when opened) under MAX_LINE bytes whose every
    line is one JSON value (the usual file: no line of it can be too long, none is torn or
    blank), decoded at once and ``fd`` closed, with the number of the first event's line;
    None otherwise, ``fd`` left open at its start for :func:`numbered_lines`."""
    # asked for one byte more than its size: all of it came when fewer did (a 1 MiB
    # buffer for each of 10,000 small files would cost more than reading them)
    data = os.read(fd, size + 1) if size < MAX_LINE else b""
    if len(data) <= size < MAX_LINE:
        body = data.strip()
        events = _decode_joined(body, body.count(b"\n") + 1) if body else []
        if events is not None:
            os.close(fd)
            first = 1 + (data[:len(data) - len(data.lstrip())].count(b"\n")
                         if data[:1].isspace() else 0)
            return events, first
    os.lseek(fd, 0, os.SEEK_SET)
    return None


_WHY = {_MALFORMED: "not a trace event (a field missing or of the wrong type)",
        _OUT_OF_RANGE: "a number that is not finite or out of range"}


def load(path: str | Path) -> Trace:
    p = Path(path)
    if not p.exists():
        raise TraceError(f"no trace at {p}: check the path (a trace is a directory of "
                         f".jsonl files written by 'bootseer run --trace' or "
                         f"BOOTSEER_TRACE_LOCATION)")
    named = not p.is_dir()   # a file the user names is followed if it is a link
    files = [str(p)] if named else sorted(_jsonl(p))
    if not files:
        raise TraceError(f"{p} holds no trace files (*.jsonl)")
    t = Trace(files=len(files))
    root = str(p.parent if named else p)
    seen: set = set()
    for f in files:
        opened = _open_sized(f, named)
        if opened is None:
            t.skipped_files += 1
            continue
        fd, size = opened
        small = _read_small(fd, size)
        torn_at = None   # the number of an unterminated last line
        linenos: Sequence[int]
        if small is not None:
            parsed, first = small
            linenos = range(first, first + len(parsed))
        else:
            numbered, long_at, torn_at = numbered_lines(fd)
            linenos = [n for n, _ in numbered]
            for n in long_at:
                t.long_lines += 1
                t.skip(os.path.relpath(f, root), n, f"longer than {MAX_LINE // 1024} KiB")
            raws = [raw for _, raw in numbered]
            decoded = _decode_joined(b"\n".join(raws), len(raws))
            parsed = decoded if decoded is not None else [_decoded(raw) for raw in raws]
        events, problems = t.events, t.problems
        for lineno, ev in zip(linenos, parsed, strict=True):
            bad = _check(ev)
            if bad:
                t.rejected += bad == _OUT_OF_RANGE
                why = _WHY[bad] if ev is not None else (
                    "torn (no end of line: its writer was killed mid-write?)"
                    if lineno == torn_at else "not one JSON value")
                t.skip(os.path.relpath(f, root), lineno, why)
                continue
            start, end = ev["start"], ev["end"]
            if end < start and not (type(ev.get("mono_start")) in _NUMBER
                                    and type(ev.get("mono_end")) in _NUMBER):
                # (with both clocks recorded the report places it by the monotonic one)
                problems.append(f"{os.path.relpath(f, root)}:{lineno}: phase {ev['phase']} "
                                f"ends before it starts; clamped")
                ev["end"] = end = start
            key = (ev["job"], ev["attempt"], ev["node"], ev.get("pid"), ev.get("kind"),
                   ev["phase"], start, end)
            if key in seen:  # the same file copied twice, a retried upload...
                t.duplicates += 1
                continue
            seen.add(key)
            events.append(ev)
    t.problems += t.bad_lines
    if t.skipped_lines > len(t.bad_lines):
        t.problems.append(f"{t.skipped_lines - len(t.bad_lines)} more skipped line(s) not "
                          f"named")
    if t.skipped_files:
        t.problems.append(f"skipped {t.skipped_files} trace file(s) that are not regular "
                          f"files (a FIFO, a device or a symlink)")
    if t.long_lines:
        t.problems.append(f"skipped {t.long_lines} line(s) longer than "
                          f"{MAX_LINE // 1024} KiB")
    if t.rejected:
        t.problems.append(f"rejected {t.rejected} event(s) with NaN, infinite or "
                          f"out-of-range numbers")
    if t.duplicates:
        t.problems.append(f"dropped {t.duplicates} duplicate event(s) (same node, process, "
                          f"phase, start and end)")
    t.jobs = jobs = {e["job"] for e in t.events}
    if len(jobs) > 1:
        t.problems.append(f"trace mixes {len(jobs)} jobs ({', '.join(sorted(map(str, jobs))[:5])}"
                          f"); report the job directory instead")
    return t


def _jsonl(root: Path) -> list[str]:
    out = []
    for d, _, names in os.walk(root):  # faster than rglob over 10,000 files; str, not Path
        out += [os.path.join(d, n) for n in names if n.endswith(".jsonl")]
    return out
