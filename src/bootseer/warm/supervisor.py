"""The container's command when ``bootseer run --image ... --warm``: the zygote must live
in the job's own rootfs and mount namespace, so this runs there as the job's command.

    python -m bootseer_warm.supervisor --max-rss MB --timeout S -- CMD ARGS

Starts the zygote (importing the module list the previous start's capture wrote next to
its socket), runs CMD with its workers routed through the launcher, relays SIGTERM, SIGINT
and SIGHUP to it, stops the zygote and ends with CMD's exit code (128+N for a signal, as a
shell reports it: this may be the container's PID 1, which cannot kill itself). A command
that cannot be routed or a zygote that does not start: CMD runs cold, said in one line.
Standard library only (shipped into images without bootseer, like the trace shim).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys

from bootseer.warm import worker
from bootseer.warm.session import _PKG, Session, route

RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _say(line: str) -> None:
    print(f"bootseer {line}", file=sys.stderr, flush=True)


def _launcher_args(run: list[str], env: dict[str, str]) -> list[str] | None:
    """The launcher's arguments when ``run`` (``PY -m ...warm.worker ARGS``) can be served
    by this process: ``PY`` is this interpreter, with no flags of its own. Asking the
    zygote from here saves an interpreter start on the way to the job."""
    if len(run) < 3 or run[1:3] != ["-m", f"{_PKG}.worker"]:
        return None
    exe = shutil.which(run[0], path=env.get("PATH"))
    if exe is None or os.path.realpath(exe) != os.path.realpath(sys.executable):
        return None
    return run[3:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bootseer_warm.supervisor")
    p.add_argument("--max-rss", type=int, default=0, metavar="MB")
    p.add_argument("--timeout", type=float, default=5.0, metavar="S")
    p.add_argument("--kept", action="store_true",
                   help="the zygote was started by bootseer run in a container of its own "
                        "(kept between starts): route the workers, start none here")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS (the job's command)")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("no command: python -m bootseer_warm.supervisor -- CMD ARGS")
    env = {**os.environ, "BOOTSEER_WARM_TIMEOUT_S": str(args.timeout)}
    routed = route(cmd, env)
    session = kept = None
    if isinstance(routed, str):
        _say(f"warm: {routed}: workers start cold")
        run = cmd
    elif args.kept:
        kept = Session(routed, env, os.getcwd(), max_rss_mb=args.max_rss, keep_s=0)
        env.update(kept.job_env())
        run = routed.argv
        here = _launcher_args(run, env)
        if here is not None:   # a miss execs the command cold from here, as the launcher
            os.environ.clear()
            os.environ.update(env)
            rc = worker.main(here)
            _say(f"warm: zygote kept ({kept.memory_mb()} MiB held)")
            return rc
    else:
        session = Session(routed, env, os.getcwd(), max_rss_mb=args.max_rss, keep_s=0)
        session.env.update(session.job_env())
        env = session.env
        said = session.start()
        _say(said)
        run = cmd if "no zygote" in said else routed.argv
        if "no zygote" in said:
            session = None
    try:
        proc = subprocess.Popen(run, env=env)
    except FileNotFoundError:
        _say(f"error: command {cmd[0]!r} not found")
        if session is not None:
            session.close(keep=False)
        return 127

    def relay(signum, _frame):
        proc.send_signal(signum)
    for sig in RELAYED:
        signal.signal(sig, relay)
    try:
        rc = proc.wait()
    finally:
        if session is not None:
            _say(session.close(keep=False))
        elif kept is not None:   # what the zygote kept between containers holds now
            _say(f"warm: zygote kept ({kept.memory_mb()} MiB held)")
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
