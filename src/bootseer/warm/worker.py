"""The worker launcher: what torchrun runs as a worker when starts are warm.

    python -m bootseer.warm.worker -- SCRIPT ARGS
    python -m bootseer.warm.worker --launch torch.distributed.run -- OPTS WORKER

Asks this node's zygote for a fork that takes over this process's stdio, argv,
environment and cwd, relays SIGTERM/SIGINT/SIGHUP to it and ends as it ended (same exit
code, same signal), so torchrun sees an ordinary worker. Any miss (no zygote, key differs,
check failed, zygote gone, timeout) is said in one line and becomes a cold exec of the
same command. Either way the outcome is traced as phase ``job.warm``.

With ``--launch MODULE``, the fork runs ``python -m MODULE OPTS WORKER`` instead: torchrun
itself, whose ``import torch`` the zygote has done too. ``WORKER`` (its ``--no-python PY -u
-m ...worker -- SCRIPT ARGS``) names the script the zygote is keyed on.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import dataclass

from bootseer import trace
from bootseer.warm import proto
from bootseer.warm.key import socket_path, warm_key

TIMEOUT_VAR = "BOOTSEER_WARM_TIMEOUT_S"
"""Seconds to wait for the zygote's answer before starting cold (default 5)."""
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class Served:
    """A forked child: the connection its exit status comes back on (and what was read
    of it already), its pid, and whether it is in the launcher's PID namespace."""
    sock: socket.socket
    pid: int
    buf: bytearray
    same_pidns: bool


def _ask(cmd: list[str], run: list[str], module: str | None = None) -> Served | str:
    """A forked child running ``run`` (``python run...``, or ``python -m module run...``)
    from the zygote of worker ``cmd``, and the connection its exit status comes back on, or
    why the zygote cannot serve it."""
    try:
        path = socket_path(cmd, os.getcwd())
    except PermissionError as e:
        return str(e)
    if not os.path.exists(path):
        return "no zygote for this script here"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(float(os.environ.get(TIMEOUT_VAR) or 5))
    except ValueError:
        sock.close()
        return f"{TIMEOUT_VAR} is not a number of seconds"
    # this process's root: a zygote kept in another container has its child chroot there,
    # so the child sees the job's own mounts (image, binds, checkpoint, /dev)
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    # one buffer for both answers: a child that ends at once has its exit status read
    # with the fork's answer, and it must not be dropped with a buffer of its own
    buf = bytearray()
    try:
        sock.connect(path)
        if proto.peer_uid(sock) != os.getuid():
            sock.close()
            return "the zygote socket belongs to another user"
        unbuffered = bool(getattr(sys.stdout, "write_through", False))   # python -u
        proto.send(sock, {"op": "fork", "argv": run, "module": module,
                          "env": dict(os.environ), "cwd": os.getcwd(),
                          "unbuffered": unbuffered,
                          "key": warm_key(cmd, os.environ, os.getcwd())},
                   [0, 1, 2, root])
        reply = proto.recv(sock, buf)
    except ConnectionResetError:
        reply = None
    except (OSError, ValueError) as e:
        sock.close()
        return f"zygote unreachable ({e.__class__.__name__}: {e})"
    finally:
        os.close(root)
    if reply is None:
        sock.close()
        return "zygote closed the connection (died mid-fork?)"
    if not reply.get("ok"):
        sock.close()
        return str(reply.get("why", "refused"))
    return Served(sock, int(reply["pid"]), buf, reply.get("pidns") == _pidns())


def _pidns() -> int | None:
    """This process's PID namespace; None when the /proc it sees is another namespace's (a
    launcher forked by a zygote kept in a container of its own, in the job's root): its
    children are then signalled over the socket."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _wait(served: Served) -> int:
    """Relay signals to the child until the zygote reports how it ended; end the same way.
    A child in another PID namespace (of a zygote kept in a container of its own) is
    signalled over the socket: the zygote sends the signal on."""
    sock, pid, buf = served.sock, served.pid, served.buf

    def relay(signum, _frame):
        try:
            if served.same_pidns:
                os.kill(pid, signum)
            else:
                proto.send(sock, {"op": "signal", "sig": signum})
        except (ProcessLookupError, OSError):
            pass
    for sig in RELAYED:
        signal.signal(sig, relay)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)   # one that came meanwhile: relayed
    sock.settimeout(None)
    while True:
        try:
            reply = proto.recv(sock, buf)
            break
        except InterruptedError:
            continue
    if reply is None:
        print(f"bootseer warm: zygote gone while worker {pid} ran; exit status lost",
              file=sys.stderr)
        return 1
    if "signal" in reply:
        ended = int(reply["signal"])
        if ended not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(ended, signal.SIG_DFL)
        sys.stderr.flush()
        os.kill(os.getpid(), ended)
        return 128 + ended
    return int(reply["exit"])


def launched_worker(opts: list[str]) -> list[str]:
    """The worker command (SCRIPT ARGS) in a launcher's arguments: what follows ``--``
    after ``-m ...warm.worker``; empty when there is none."""
    for i in range(len(opts) - 2):
        if opts[i] == "-m" and opts[i + 1].endswith("warm.worker") and opts[i + 2] == "--":
            return opts[i + 3:]
    return []


def main(argv: list[str] | None = None) -> int:
    cmd = list(sys.argv[1:] if argv is None else argv)
    module = None
    if cmd[:1] == ["--launch"] and len(cmd) > 1:
        module, cmd = cmd[1], cmd[2:]
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    run = cmd
    if module is not None:
        cmd = launched_worker(run)
    if not cmd:
        print("bootseer warm: no worker command (hint: python -m bootseer.warm.worker -- "
              "train.py ARGS)", file=sys.stderr)
        return 2
    start = time.time()
    # Held from before the fork until the relay is set up: a Ctrl-C or SIGTERM that comes
    # once the child runs must reach the child, not end the launcher and orphan it.
    signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)
    served = _ask(cmd, run, module)
    role = {"launcher": module} if module else {}
    if isinstance(served, str):
        trace.emit("job.warm", start, time.time(), hit=False, why=served, **role)
        print(f"bootseer warm: cold start ({served})", file=sys.stderr, flush=True)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)   # exec keeps the mask
        os.execv(sys.executable, [sys.executable, *(["-m", module] if module else []), *run])
    trace.emit("job.warm", start, time.time(), hit=True, pid=served.pid, **role)
    return _wait(served)


if __name__ == "__main__":
    sys.exit(main())
