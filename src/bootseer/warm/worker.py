"""The worker launcher: what torchrun runs as a worker when starts are warm.

    python -m bootseer.warm.worker -- SCRIPT ARGS

Asks this node's zygote for a fork that takes over this process's stdio, argv,
environment and cwd, relays SIGTERM/SIGINT/SIGHUP to it and ends as it ended (same exit
code, same signal), so torchrun sees an ordinary worker. Any miss (no zygote, key differs,
check failed, zygote gone, timeout) is said in one line and becomes a cold exec of the
same command. Either way the outcome is traced as phase ``job.warm``.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from bootseer import trace
from bootseer.warm import proto
from bootseer.warm.key import socket_path, warm_key

TIMEOUT_VAR = "BOOTSEER_WARM_TIMEOUT_S"
"""Seconds to wait for the zygote's answer before starting cold (default 5)."""
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _ask(cmd: list[str]) -> tuple[socket.socket, int] | str:
    """A forked child serving ``cmd`` and the connection its exit status comes back on, or
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
    try:
        sock.connect(path)
        if proto.peer_uid(sock) != os.getuid():
            sock.close()
            return "the zygote socket belongs to another user"
        unbuffered = bool(getattr(sys.stdout, "write_through", False))   # python -u
        proto.send(sock, {"op": "fork", "argv": cmd, "env": dict(os.environ),
                          "cwd": os.getcwd(), "unbuffered": unbuffered,
                          "key": warm_key(cmd, os.environ, os.getcwd())},
                   [0, 1, 2])
        reply = proto.recv(sock, bytearray())
    except ConnectionResetError:
        reply = None
    except (OSError, ValueError) as e:
        sock.close()
        return f"zygote unreachable ({e.__class__.__name__}: {e})"
    if reply is None:
        sock.close()
        return "zygote closed the connection (died mid-fork?)"
    if not reply.get("ok"):
        sock.close()
        return str(reply.get("why", "refused"))
    return sock, int(reply["pid"])


class _Relay:
    """Signals for the child, caught from before the zygote is asked: one that arrives
    while the child starts is held and passed on once its pid is known, never lost (nor
    taken by the launcher alone, which would leave the child running)."""

    def __init__(self) -> None:
        self.pid = 0
        self.pending: list[int] = []
        for sig in RELAYED:
            signal.signal(sig, self._caught)

    def _caught(self, signum, _frame) -> None:
        if not self.pid:
            self.pending.append(signum)
            return
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def to(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            self._caught(signum, None)

    def release(self) -> None:
        """Default handling again (before a cold exec): a signal held meanwhile ends this
        process as it would have ended the worker."""
        for sig in RELAYED:
            signal.signal(sig, signal.SIG_DFL)
        for signum in self.pending:
            os.kill(os.getpid(), signum)


def _wait(sock: socket.socket, pid: int, relay: _Relay) -> int:
    """Relay signals to the child until the zygote reports how it ended; end the same way."""
    relay.to(pid)
    sock.settimeout(None)
    buf = bytearray()
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


def main(argv: list[str] | None = None) -> int:
    cmd = list(sys.argv[1:] if argv is None else argv)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        print("bootseer warm: no worker command (hint: python -m bootseer.warm.worker -- "
              "train.py ARGS)", file=sys.stderr)
        return 2
    start = time.time()
    relay = _Relay()
    served = _ask(cmd)
    if isinstance(served, str):
        trace.emit("job.warm", start, time.time(), hit=False, why=served)
        print(f"bootseer warm: cold start ({served})", file=sys.stderr, flush=True)
        relay.release()
        os.execv(sys.executable, [sys.executable, *cmd])
    sock, pid = served
    trace.emit("job.warm", start, time.time(), hit=True, pid=pid)
    return _wait(sock, pid, relay)


if __name__ == "__main__":
    sys.exit(main())
