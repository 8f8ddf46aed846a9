"""The flags several commands share, each defined once here: a verb adds them by name, so a
flag is spelled, checked and explained the same wherever it appears."""

from __future__ import annotations

import argparse

STORE_HELP = ("bootseer store URL: a directory, http(s)://, oci://, s3://... (default: "
              "BOOTSEER_STORE_URL, else the embedded default directory)")
IMAGE_REF_HELP = "tree digest, store ref, or the reference of an image converted into the store"
INDEX_URL_HELP = "package index (repeatable; default: uv's, from its settings)"
TRACE_LOCATION_HELP = ("trace location, as for `run --trace`: a directory or a store URL "
                       "(default BOOTSEER_TRACE_LOCATION)")

JSON_SCHEMA = 1
"""Version of every ``--json`` document (``"schema": 1``): raised when a field changes
meaning or goes away; new fields do not raise it."""


def add_output_flags(parser, *, default) -> None:
    """How much a command says: ``-v``, ``-q``, ``--no-progress``. On a verb the defaults
    are SUPPRESS, so a flag given before the command is kept when the verb does not
    repeat it."""
    def given(value):
        return value if default is None else argparse.SUPPRESS
    parser.add_argument("-v", "--verbose", action="count", default=given(0),
                        help="more logging (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", default=given(False),
                        help="no status lines or progress bars (errors and warnings only)")
    parser.add_argument("--no-progress", action="store_true", default=given(False),
                        help="no progress bars (status lines stay)")


def add_store_arg(parser, help: str = STORE_HELP, **kw) -> None:
    """``--store URL``: the bootseer store a verb reads or writes (default: the settings)."""
    parser.add_argument("--store", metavar="URL", help=help, **kw)


def add_index_url_arg(parser, help: str = INDEX_URL_HELP) -> None:
    """``--index-url URL`` (repeatable): the package indexes an environment resolves from."""
    parser.add_argument("--index-url", action="append", default=[], metavar="URL", help=help)


def add_json_arg(parser, what: str) -> None:
    """``--json``: the verb's result as one JSON document on standard output."""
    parser.add_argument("--json", action="store_true",
                        help=f"print {what} as one JSON document (with \"schema\": "
                             f"{JSON_SCHEMA}) instead of text")


def add_json_file_arg(parser, note: str = "") -> None:
    """``--json FILE``: a JSON summary, for a verb whose text report goes to standard
    output beside it."""
    parser.add_argument("--json", metavar="FILE",
                        help=f"write a JSON summary (- : standard output{note})")


def add_trace_location_arg(parser) -> None:
    """``--trace LOCATION`` (also spelled ``--location``) of the ``trace`` verbs."""
    parser.add_argument("--trace", "--location", dest="location", metavar="LOCATION",
                        help=TRACE_LOCATION_HELP)


def add_fallback_arg(parser) -> None:
    """``--fallback pull|never`` of every command that starts a job."""
    parser.add_argument("--fallback", choices=("pull", "never"), default="pull",
                        help="when the fast path is unavailable (an image never converted, "
                             "no snapshot in the store): pull takes the conventional one "
                             "(podman pull, pip install) and says so in one line and in the "
                             "trace; never fails instead")


def add_ready_regex_arg(parser, help: str) -> None:
    """``--ready-regex REGEX``: the job is ready at the first line of its output that
    matches (checked by :func:`ready_regex`)."""
    parser.add_argument("--ready-regex", metavar="REGEX", help=help)


def ready_regex(text: str | None) -> str | None:
    """``--ready-regex``, refused now if it is not a regular expression."""
    import re

    from bootseer.errors import ConfigError
    if text is None:
        return None
    try:
        re.compile(text)
    except re.error as e:
        raise ConfigError("--ready-regex", f"{text!r} is not a regular expression: {e}") from e
    return text


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
