"""``bootseer trace``: record phases from the shell."""

from __future__ import annotations

from bootseer.cli._flags import add_trace_location_arg


def register(sub) -> None:
    p = sub.add_parser("trace", help="record a command as a traced phase",
                       description="Record startup phases. Events go to BOOTSEER_TRACE_LOCATION "
                                   "(or --trace) as JSON lines, one file per process; a "
                                   "store URL (oci://, s3://, file:///dir, ...) gets them "
                                   "uploaded when the command ends.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("exec", help="run CMD and record it as phase NAME")
    v.add_argument("--phase", required=True, help="phase name, e.g. deps.install")
    add_trace_location_arg(v)
    v.add_argument("argv", nargs="+", metavar="-- CMD", help="the command to run and record")
    v.set_defaults(func=_exec)
    v = verbs.add_parser("mark", help="record an instant (e.g. ready, rendezvous)")
    v.add_argument("name", help="what happened, e.g. ready or rendezvous")
    add_trace_location_arg(v)
    v.set_defaults(func=_mark)


def _exec(args) -> int:
    import subprocess
    import sys

    from bootseer import trace
    from bootseer.report import remote
    argv = args.argv[1:] if args.argv[0] == "--" else args.argv
    with remote.command_recording(args.location) as recorded:
        if not recorded:   # the command still runs: tracing never stops a job
            print(f"bootseer: warning: no trace location: phase {args.phase!r} is not "
                  f"recorded; pass --trace DIR|URL or set BOOTSEER_TRACE_LOCATION",
                  file=sys.stderr)
        with trace.phase(args.phase, cmd=argv[0]) as span:
            try:
                rc = subprocess.call(argv)
            except (FileNotFoundError, PermissionError) as e:
                print(f"bootseer trace exec: cannot run {argv[0]}: {e.strerror}",
                      file=sys.stderr)
                rc = 127 if isinstance(e, FileNotFoundError) else 126
            span.set(exit=rc)
            if rc:
                span.fail(f"{argv[0]} exited with {rc}" if rc > 0 else
                          f"{argv[0]} killed by signal {-rc}")
    return rc if rc >= 0 else 128 - rc


def _mark(args) -> int:
    from bootseer import trace
    from bootseer.cli._errors import with_hint
    from bootseer.errors import UsageError
    from bootseer.report import remote
    with remote.command_recording(args.location) as recorded:
        if not recorded:   # the mark would go nowhere
            raise with_hint(UsageError(f"nowhere to record the mark {args.name!r}: no trace "
                                       f"location"),
                            "pass --trace DIR|URL or set BOOTSEER_TRACE_LOCATION")
        trace.mark(args.name)
    return 0
