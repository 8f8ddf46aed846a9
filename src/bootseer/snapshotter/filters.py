"""The subset of containerd's filter syntax that snapshot listings use: a filter is a
comma-separated conjunction of ``FIELD``, ``FIELD==VALUE``, ``FIELD!=VALUE`` or
``FIELD~=REGEX``; FIELD is ``name``, ``parent``, ``kind`` or ``labels.KEY`` (KEY may be
quoted: ``labels."containerd.io/gc.root"``); VALUE may be quoted. A listing returns what
matches any of the filters given."""

from __future__ import annotations

import re
from collections.abc import Callable

from bootseer.snapshotter.metadata import KIND_NAMES, Snapshot, SnapshotError

_TERM = re.compile(r'\s*(?P<field>name|parent|kind|labels\.(?:"(?:[^"\\]|\\.)*"|[\w./-]+))'
                   r'\s*(?:(?P<op>==|!=|~=)\s*(?P<value>"(?:[^"\\]|\\.)*"|[^,]*))?\s*(?:,|$)')


def _unquote(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] == '"':
        return re.sub(r"\\(.)", r"\1", s[1:-1])
    return s


def parse(text: str) -> Callable[[Snapshot], bool]:
    """A predicate over snapshots; a one-line error for what it does not understand."""
    # (field, operator, value, the value compiled where the operator is ~=)
    terms: list[tuple[str, str | None, str | None, re.Pattern[str] | None]] = []
    pos = 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if not m or m.end() == pos:
            raise SnapshotError("INVALID_ARGUMENT", f"unsupported filter {text!r} at {pos}")
        field = m["field"]
        if field.startswith("labels."):
            field = "labels." + _unquote(field[7:])
        value = None if m["value"] is None else _unquote(m["value"])
        pattern = None
        if m["op"] == "~=":
            assert value is not None        # _TERM matches an operator only with its value
            try:
                pattern = re.compile(value)
            except re.error as e:
                raise SnapshotError(
                    "INVALID_ARGUMENT", f"bad regex in filter {text!r}: {e}") from e
        terms.append((field, m["op"], value, pattern))
        pos = m.end()

    def matches(s: Snapshot) -> bool:
        for field, op, value, pattern in terms:
            have = _field(s, field)
            if op is None and have is None:
                return False
            if op == "==" and have != value:
                return False
            if op == "!=" and have == value:
                return False
            if pattern is not None and (have is None or not pattern.search(have)):
                return False
        return True
    return matches


def _field(s: Snapshot, field: str) -> str | None:
    if field == "name":
        return s.key
    if field == "parent":
        return s.parent
    if field == "kind":
        return KIND_NAMES[s.kind]
    return s.labels.get(field[7:])
