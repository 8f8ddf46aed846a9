"""`bootseer completion bash`: the script, loaded into a real bash, completes commands,
verbs, options and choices from the parser as it is."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> str:
    p = subprocess.run([sys.executable, "-m", "bootseer", "completion", "bash"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    path = tmp_path_factory.mktemp("completion") / "bootseer.bash"
    path.write_text(p.stdout)
    return str(path)


def complete(script: str, line: str, cwd=None) -> list[str]:
    """What TAB offers after ``line`` (a trailing space starts a new word)."""
    words = shlex.split(line) + ([""] if line.endswith(" ") else [])
    code = (f"source {shlex.quote(script)}; COMP_WORDS=({' '.join(map(shlex.quote, words))}); "
            f"COMP_CWORD={len(words) - 1}; _bootseer; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    p = subprocess.run(["bash", "--norc", "--noprofile", "-c", code], capture_output=True,
                       text=True, cwd=cwd, timeout=30)
    assert p.returncode == 0 and not p.stderr, p.stderr
    return [w for w in p.stdout.splitlines() if w]


@pytest.mark.parametrize("line, expected", [
    ("bootseer im", ["image"]),
    ("bootseer image conv", ["convert"]),
    ("bootseer image convert --pl", ["--platform"]),
    ("bootseer image convert --no-", ["--no-progress", "--no-referrer", "--no-tls-verify"]),
    ("bootseer image run img --fallback ", ["never", "pull"]),
    ("bootseer -v store --store /tmp/s g", ["gc", "get"]),
    ("bootseer store ref ", ["get", "rm", "set"]),
    ("bootseer completion ", ["bash"]),
])
def test_completes_from_the_parser(script, line, expected):
    assert sorted(complete(script, line)) == expected


def test_values_and_commands_complete_file_names(script, tmp_path):
    (tmp_path / "layout-dir").mkdir()
    assert complete(script, "bootseer image convert --store lay", cwd=tmp_path) == ["layout-dir"]
    # after `--`, the container's command: files, not bootseer's verbs
    assert complete(script, "bootseer image run img -- lay", cwd=tmp_path) == ["layout-dir"]
