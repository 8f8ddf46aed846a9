"""``bootseer`` entry point.

Every module of this package that defines ``register(subparsers)`` adds one command
group. Modules parse arguments, build a :class:`~bootseer.config.BootseerConfig`, and call
the package that owns the verb; heavy imports happen inside the handlers so that
``bootseer --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

import bootseer

# Group order in --help; modules not listed come after, alphabetically.
_ORDER = ["run", "demo", "image", "deps", "ckpt", "trace", "report", "analyze", "simulate",
          "store", "doctor"]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI, or with ``only`` just that command's module (a command's start then
    costs its own imports, not every command's: a warm ``deps ensure`` returns at once)."""
    from bootseer.cli import Parser
    from bootseer.cli._flags import add_output_flags
    parser = Parser(
        prog="bootseer",
        description="Make large training jobs start fast: trace startup, prefetch hot image "
                    "blocks, restore dependency snapshots, stripe checkpoint reads.")
    parser.add_argument("--version", action="version", version=f"bootseer {bootseer.__version__}")
    add_output_flags(parser, default=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import bootseer.cli as pkg
    names = [m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name != "main"
             and not m.name.startswith("_")]
    names.sort(key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    if only in names:
        names = [only]
    for name in names:
        module = importlib.import_module(f"bootseer.cli.{name}")
        if hasattr(module, "register"):
            module.register(sub)
    for verb in _leaves(parser):   # -q, -v, --no-progress after the verb too, as uv takes them
        add_output_flags(verb, default=argparse.SUPPRESS)
    return parser


def _leaves(parser):
    """The parsers of every verb (those without verbs of their own)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser
    for action in subs:
        for child in dict.fromkeys(action.choices.values()):   # aliases: once
            yield from _leaves(child)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="bootseer: %(levelname)s %(name)s: %(message)s")
    from bootseer import redact
    redact.install_log_filter()   # no URL credentials in -v logs, whoever logs them
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from bootseer.cli import _errors, _status
    _status.configure(quiet=args.quiet, progress=not args.no_progress)
    _errors.warn_unknown_variables()
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - every failure is one error line, never a traceback
        return _errors.report(e, args.verbose)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
