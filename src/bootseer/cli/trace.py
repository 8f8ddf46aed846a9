"""``bootseer trace``: record phases from the shell."""

from __future__ import annotations

import argparse

TRACE_HELP = "trace location, as for `bootseer run --trace` (default: BOOTSEER_TRACE_LOCATION)"


def _add_trace_arg(v) -> None:
    """``--trace``, the spelling of every command; ``--location``, its first, still read."""
    v.add_argument("--trace", dest="location", metavar="LOCATION", help=TRACE_HELP)
    v.add_argument("--location", dest="location", help=argparse.SUPPRESS)


def register(sub) -> None:
    p = sub.add_parser("trace", help="record a command as a traced phase",
                       description="Record startup phases. Events go to BOOTSEER_TRACE_LOCATION "
                                   "(or --trace) as JSON lines, one file per process.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("exec", help="run CMD and record it as phase NAME")
    v.add_argument("--phase", required=True, help="phase name, e.g. deps.install")
    _add_trace_arg(v)
    v.add_argument("argv", nargs="+", metavar="-- CMD", help="the command to run and record")
    v.set_defaults(func=_exec)
    v = verbs.add_parser("mark", help="record an instant (e.g. ready, rendezvous)")
    v.add_argument("name", help="what happened, e.g. ready or rendezvous")
    _add_trace_arg(v)
    v.set_defaults(func=_mark)


def _setloc(args) -> None:
    import os
    if args.location:
        os.environ["BOOTSEER_TRACE_LOCATION"] = args.location


def _exec(args) -> int:
    import subprocess
    import sys
    from bootseer import trace
    _setloc(args)
    argv = args.argv[1:] if args.argv[0] == "--" else args.argv
    with trace.phase(args.phase, cmd=argv[0]) as span:
        try:
            rc = subprocess.call(argv)
        except (FileNotFoundError, PermissionError) as e:
            print(f"bootseer trace exec: cannot run {argv[0]}: {e.strerror}", file=sys.stderr)
            rc = 127 if isinstance(e, FileNotFoundError) else 126
        span.set(exit=rc)
        if rc:
            span.fail(f"{argv[0]} exited with {rc}" if rc > 0 else
                      f"{argv[0]} killed by signal {-rc}")
    return rc if rc >= 0 else 128 - rc


def _mark(args) -> int:
    import os
    from bootseer import trace
    from bootseer.cli._errors import with_hint
    from bootseer.errors import UsageError
    _setloc(args)
    if not os.environ.get("BOOTSEER_TRACE_LOCATION"):   # the mark would go nowhere
        raise with_hint(UsageError(f"nowhere to record the mark {args.name!r}: no trace "
                                   f"location"),
                        "pass --trace DIR or set BOOTSEER_TRACE_LOCATION")
    trace.mark(args.name)
    return 0
