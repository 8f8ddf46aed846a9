"""Command line: argument parsing only. Each module here adds one command group."""

from __future__ import annotations

import argparse
import json
import sys

STORE_HELP = ("bootseer store URL: a directory, http(s)://, oci://, s3://... (default: "
              "BOOTSEER_STORE_URL, else the embedded default directory)")
IMAGE_REF_HELP = "tree digest, store ref, or the reference of an image converted into the store"
INDEX_URL_HELP = "package index (repeatable; default: uv's, from its settings)"

JSON_SCHEMA = 1
"""Version of every ``--json`` document (``"schema": 1``): raised when a field changes
meaning or goes away; new fields do not raise it."""


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


def add_json_arg(parser, what: str) -> None:
    parser.add_argument("--json", action="store_true",
                        help=f"print {what} as one JSON document (with \"schema\": "
                             f"{JSON_SCHEMA}) instead of text")


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


def add_gc_verb(verbs, what: str, func):
    """``gc [--max-size 50G] [--dry-run]``, the same for every node-local store of things
    (environments, staged checkpoints): least recently used first, never one in use."""
    v = verbs.add_parser("gc", help=f"remove this node's least recently used {what} until "
                                    "the rest fit SIZE (never one in use)")
    v.add_argument("--max-size", default="50G", metavar="SIZE",
                   help=f"disk the {what} on this node may use")
    v.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    v.set_defaults(func=func)
    return v

