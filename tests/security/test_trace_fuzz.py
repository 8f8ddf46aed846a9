"""Fuzz of the trace loader: any JSON value in any field of an event never raises past the
loader. Each bad event is skipped with a counted warning naming file:line; the report
(text, JSON, HTML, Perfetto, Prometheus, OTLP) is made from the rest."""

from __future__ import annotations

import contextlib
import io
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bootseer.cli.main import main
from bootseer.report import load as trace_load

FIELDS = ["job", "attempt", "node", "phase", "start", "end", "v", "rank", "gpus", "pid",
          "kind", "parent", "status", "start_id", "mono_start", "mono_end", "attrs"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6)


def good_event(node: str, i: int) -> dict:
    return {"v": 1, "job": "j", "attempt": 0, "node": node, "rank": i, "gpus": 1, "pid": 10 + i,
            "kind": "phase", "phase": ["image.lazy", "deps.ensure", "ckpt.load", "job.run"][i % 4],
            "parent": None, "start": 1000.0 + i, "end": 1001.5 + i, "mono_start": 5.0 + i,
            "mono_end": 6.5 + i, "status": "ok", "attrs": {"bytes": 10 * i}}


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(edits=st.lists(st.tuples(st.integers(0, 7), st.sampled_from(FIELDS), json_values),
                      min_size=1, max_size=6))
def test_any_value_in_any_field_never_raises_past_the_loader(tmp_path_factory, edits):
    root = tmp_path_factory.mktemp("trace")
    events = [good_event(f"n{i % 2}", i) for i in range(8)]
    events.append({**good_event("n0", 9), "kind": "mark", "phase": "ready"})
    events.append({**good_event("n1", 9), "kind": "mark", "phase": "ready"})
    for i, name, value in edits:
        events[i][name] = value
    d = root / "j/0"
    d.mkdir(parents=True)
    (d / "n.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    t = trace_load.load(root / "j")
    assert len(t.events) + t.skipped_lines + t.duplicates == len(events)
    out = root / "out"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["report", str(root / "j"), "--json", str(out) + ".json", "--html",
                     str(out) + ".html", "--chrome", str(out) + ".chrome.json", "--prom",
                     str(out) + ".prom", "--otlp", str(out) + ".otlp"])
    assert code in (0, 1) and "unexpected" not in err.getvalue(), err.getvalue()


def test_the_malformed_events_of_the_issue_are_skipped_and_named(tmp_path, capsys):
    d = tmp_path / "j/0"
    d.mkdir(parents=True)
    bad = [{**good_event("n0", 0), "parent": 12345}, {**good_event("n0", 1), "parent": ["a"]},
           {**good_event("n1", 2), "attrs": [1, 2]}]
    good = [good_event("n0", 3), {**good_event("n0", 4), "kind": "mark", "phase": "ready"}]
    (d / "n.jsonl").write_text("".join(json.dumps(e) + "\n" for e in bad + good))
    t = trace_load.load(tmp_path / "j")
    assert len(t.events) == 2 and t.skipped_lines == 3
    assert [p.split(": ")[0] for p in t.bad_lines] == ["0/n.jsonl:1", "0/n.jsonl:2",
                                                       "0/n.jsonl:3"]
    assert main(["report", str(tmp_path / "j"), "--html", str(tmp_path / "r.html"),
                 "--chrome", str(tmp_path / "r.json")]) == 0
    assert "unexpected" not in capsys.readouterr().err
