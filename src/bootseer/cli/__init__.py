"""Command line: argument parsing only. Each module here adds one command group; the flags
several share are defined once, in ``_flags``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

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

    def parse_known_args(self, args=None, namespace=None):
        # kept for an error about a missing option: argparse reports it before the words
        # it did not know, one of which is often that option mistyped
        self._words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """argparse's error line, with the closest known name for a mistyped one."""
        near = did_you_mean(self, message)
        if near is None and message.startswith("the following arguments are required"):
            typo = _mistyped_required(self, message)
            if typo is not None:
                super().error(f"{message} ({typo[0]}: did you mean {typo[1]}?)")
        super().error(f"{message} (did you mean {near}?)" if near else message)


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option of ``parser`` and of its commands and verbs, at any depth."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


def did_you_mean(parser: argparse.ArgumentParser, message: str) -> str | None:
    """The known command, verb, choice or option closest to the one an error message of
    argparse names as invalid or unrecognized (None when nothing is close)."""
    import difflib
    import re
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        known = re.findall(r"'([^']*)'", choice.group(2))
        close = difflib.get_close_matches(choice.group(1), known, n=1, cutoff=0.6)
        return close[0] if close else None
    extra = re.match(r"unrecognized arguments: (.*)", message)
    if extra:
        options = sorted(_option_strings(parser))
        for word in extra.group(1).split():
            if word.startswith("--"):
                close = difflib.get_close_matches(word.split("=", 1)[0], options, n=1,
                                                  cutoff=0.7)
                if close:
                    return close[0]
    return None


def _mistyped_required(parser: argparse.ArgumentParser, message: str
                       ) -> tuple[str, str] | None:
    """A missing required option given under a close misspelling: (``--prefx``,
    ``--prefix``)."""
    import difflib
    import re
    required = re.findall(r"(--[\w-]+)", message)
    known = _option_strings(parser)
    for word in getattr(parser, "_words", []):
        name = word.split("=", 1)[0]
        if name.startswith("--") and name not in known:
            close = difflib.get_close_matches(name, required, n=1, cutoff=0.7)
            if close:
                return name, close[0]
    return None


def print_json(document: dict) -> None:
    """``document``, with its schema version, on standard output."""
    print(json.dumps({"schema": JSON_SCHEMA, **document}, indent=1))


def say_none(what: str, where: str, hint: str) -> None:
    """An empty listing says so on standard error (standard output stays empty for
    scripts): ``bootseer: no converted images in STORE (hint: ...)``."""
    print(f"bootseer: no {what} in {where} (hint: {hint})", file=sys.stderr)


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
