"""node/tools: the requirements table and a failed tool's message trimmed to its cause."""

from __future__ import annotations

import pytest

from bootseer.node import tools

# skopeo's logrus lines, as a failed copy prints them (verbatim; split only to fit)
SKOPEO = (
    r'time="2026-11-28T10:00:00Z" level=warning msg="Failed, retrying in 1s ... (1/3). '
    r'Error: pinging container registry r.example: connection refused"' "\n"
    r'time="2026-11-28T10:00:01Z" level=warning msg="Failed, retrying in 1s ... (2/3). '
    r'Error: pinging container registry r.example: connection refused"' "\n"
    r'time="2026-11-28T10:00:03Z" level=fatal msg="initializing source '
    r'docker://r.example/a:1: pinging container registry r.example: '
    r'Get \"https://r.example/v2/\": dial tcp 10.0.0.1:443: connect: connection refused '
    r'(retrying 3 times)"' "\n"
)


def test_logrus_noise_is_trimmed_to_the_message_and_retries_summarized():
    text = tools.tool_message(SKOPEO)
    assert text.startswith("3 tries, last: initializing source docker://r.example/a:1")
    assert 'Get "https://r.example/v2/"' in text
    assert "time=" not in text and "level=" not in text and "retrying" not in text
    assert len(text) < 300


def test_plain_output_keeps_its_last_line_and_is_cut_from_the_front():
    assert tools.tool_message("warming up\nError: no such image\n") == "Error: no such image"
    long = tools.tool_message("x" * 1000 + " the cause", limit=50)
    assert long.endswith("the cause") and len(long) == 53


def test_require_names_the_command_and_gives_doctors_hint(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(tools.MissingTool) as e:
        tools.require("skopeo", "image convert")
    assert "image convert needs skopeo" in str(e.value)
    assert e.value.hint == tools.BY_NAME["skopeo"].hint


def test_a_module_set_to_none_is_missing(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "libtorrent", None)
    assert tools.find(tools.BY_NAME["libtorrent"]) is None
