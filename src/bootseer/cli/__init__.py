"""Command line: argument parsing only. Each module here adds one command group; the flags
several share are defined once, in ``_flags``."""

from __future__ import annotations

import argparse
import json
import sys

from bootseer.cli._flags import JSON_SCHEMA


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option shows its default, unless it has none worth saying (a flag, unset) or
    its help says it already."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, True, False, [], argparse.SUPPRESS) \
                or "default" in text.lower():
            return text
        return super()._get_help_string(action)


class RawDescriptionHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """For a command whose epilog holds examples laid out by hand."""


class Parser(argparse.ArgumentParser):
    """The parser of every command and verb (``add_subparsers`` makes its own kind)."""

    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)


def print_json(document: dict) -> None:
    """``document``, with its schema version, on standard output."""
    print(json.dumps({"schema": JSON_SCHEMA, **document}, indent=1))


def write_output(path: str, text: str) -> None:
    """A file the user named (written in place, bootseer/node/outputs.py); ``-`` is standard
    output."""
    if path == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    from bootseer.node import outputs
    outputs.write_text(path, text)


def text_stream(outputs: dict[str, str | None]):
    """Where a verb's text report goes, given the files its flags name (``{"--json":
    path}``): standard error when one of them is ``-`` (standard output then carries that
    machine-readable output), else standard output. Each named path is checked now, before
    the work, not after it; at most one may be ``-``."""
    from bootseer.errors import UsageError
    from bootseer.node import outputs as checked
    paths = [p for p in outputs.values() if p]
    if paths.count("-") > 1:
        raise UsageError(f"only one of {', '.join(outputs)} can be - (standard output)")
    for path in paths:
        if path != "-":
            checked.check(path)
    return sys.stderr if "-" in paths else sys.stdout
