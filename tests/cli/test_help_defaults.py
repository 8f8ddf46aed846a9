"""Each option's default is said once in ``--help``: either its help text says it, or the
formatter adds ``(default: X)``, never both."""

from __future__ import annotations

import argparse
import re

from bootseer.cli import HelpFormatter
from bootseer.cli.completion import _tree
from bootseer.cli.main import build_parser


def _said_twice(action: argparse.Action) -> bool:
    fmt = HelpFormatter("bootseer")
    # "(default: X" or "; default X": a statement of the default (not "the default directory")
    if len(re.findall(r"(?:\(|[;,]\s*)default\b", fmt._expand_help(action))) > 1:
        return True
    if fmt._get_help_string(action) == action.help:   # the formatter added no "(default: X)"
        return False
    d = action.default
    values = {str(d)} | ({str(int(d))} if isinstance(d, float) and d == int(d) else set())
    text = action.help or ""
    for v in values:
        if re.search(rf"\(\s*{re.escape(v)}\s*\)", text):     # "(3)" beside "(default: 3)"
            return True
        if isinstance(d, (int, float)) and re.search(rf"(?<![\w.]){re.escape(v)}(?![\w.])",
                                                       text):
            return True
    return False


def test_no_help_line_says_its_default_twice():
    fmt = HelpFormatter("bootseer")
    twice = [f"{' '.join(path)} {'/'.join(a.option_strings) or a.dest}: {fmt._expand_help(a)}"
             for path, p in _tree(build_parser()) for a in p._actions
             if a.help and a.help != argparse.SUPPRESS
             and _said_twice(a)]
    assert not twice, "\n".join(twice)


def test_the_check_finds_a_default_said_twice():
    p = argparse.ArgumentParser()
    k = p.add_argument("-k", type=float, default=3.0, help="straggler rule (3)")
    jobs = p.add_argument("--jobs", type=int, default=30000, help="jobs, 30000 of them")
    fine = p.add_argument("--window", type=float, default=120.0, help="seconds (default 120)")
    both = p.add_argument("--mode", default="a", help="a or b (default: a)")
    both.help = "a or b (default: a) (default: %(default)s)"   # as a formatter might have
    assert _said_twice(k) and _said_twice(jobs) and _said_twice(both)
    assert not _said_twice(fine)
    assert "(default: 3.0)" not in build_parser(only="report").format_help()   # (a verb's)
    report = build_parser(only="report")._subparsers._group_actions[0].choices["report"]
    assert report.format_help().count("3.0") == 1
