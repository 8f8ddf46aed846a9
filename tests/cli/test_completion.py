"""`bootseer completion bash|zsh|fish`: each script, loaded into the real shell, completes
commands, verbs, options and choices from the parser as it is."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest


def write_script(tmp_path_factory, shell: str) -> str:
    p = subprocess.run([sys.executable, "-m", "bootseer", "completion", shell],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    path = tmp_path_factory.mktemp("completion") / f"bootseer.{shell}"
    path.write_text(p.stdout)
    return str(path)


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> str:
    return write_script(tmp_path_factory, "bash")


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
    ("bootseer completion ", ["bash", "fish", "zsh"]),
])
def test_completes_from_the_parser(script, line, expected):
    assert sorted(complete(script, line)) == expected


def test_values_and_commands_complete_file_names(script, tmp_path):
    (tmp_path / "layout-dir").mkdir()
    assert complete(script, "bootseer image convert --store lay", cwd=tmp_path) == ["layout-dir"]
    # after `--`, the container's command: files, not bootseer's verbs
    assert complete(script, "bootseer image run img -- lay", cwd=tmp_path) == ["layout-dir"]


CASES = [("bootseer im", ["image"]), ("bootseer image convert --pl", ["--platform"]),
         ("bootseer image run img --fallback ", ["never", "pull"]),
         ("bootseer -v store --store /tmp/s g", ["gc", "get"]),
         ("bootseer completion ", ["bash", "fish", "zsh"])]


def test_fish_completes_from_the_parser(tmp_path_factory, tmp_path):
    """fish's own `complete -C` answers, as when TAB is pressed after the line."""
    fish = write_script(tmp_path_factory, "fish")
    (tmp_path / "layout-dir").mkdir()
    lines = [*CASES, ("bootseer image convert --store lay", ["layout-dir/"]),
             ("bootseer image run img -- lay", ["layout-dir/"])]
    code = f"source {shlex.quote(fish)}; " + "; ".join(
        f"complete -C {shlex.quote(line)}; echo ==" for line, _ in lines)
    p = subprocess.run(["fish", "--no-config", "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, timeout=30)
    assert p.returncode == 0 and not p.stderr, p.stderr
    answers = p.stdout.split("==\n")[:len(lines)]
    for (line, expected), got in zip(lines, answers, strict=True):
        assert sorted(w.split("\t")[0] for w in got.splitlines() if w) == expected, line


def test_zsh_completes_from_the_parser(tmp_path_factory):
    """The zsh function run by a real zsh on the words typed; compadd and _files (zsh's
    completion system, which filters by the typed prefix) record what they are given."""
    zsh = write_script(tmp_path_factory, "zsh")
    assert subprocess.run(["zsh", "-n", zsh], timeout=30).returncode == 0
    lines = [*CASES, ("bootseer image run img -- lay", ["FILES"])]
    code = [f"source {shlex.quote(zsh)}",
            "compadd() { [[ $1 == -- ]] && shift; print -l -- \"$@\"; }",
            "_files() { print FILES; }"]
    for line, _ in lines:
        words = shlex.split(line) + ([""] if line.endswith(" ") else [])
        code.append(f"words=({' '.join(map(shlex.quote, words))}); CURRENT={len(words)}; "
                    "_bootseer; echo @@")
    p = subprocess.run(["zsh", "-f", "-c", "\n".join(code)], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0 and not p.stderr, p.stderr
    answers = p.stdout.split("@@\n")[:len(lines)]
    for (line, expected), got in zip(lines, answers, strict=True):
        typed = shlex.split(line)[-1] if not line.endswith(" ") else ""
        offered = sorted(w for w in got.splitlines() if w.startswith(typed) or w == "FILES")
        assert offered == expected, line
