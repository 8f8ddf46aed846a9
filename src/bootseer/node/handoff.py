"""A helper process handed its work on stdin, which says on its first line of stdout whether
it took it: the holders that keep a mount served beyond the command that made it (the
snapshotter's trees, a kept zygote's image). Each runs in a session of its own, so a
signal to the command's process group never reaches it."""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import time
from typing import IO


def start(argv: list[str], spec: object, *, timeout_s: float,
          stderr: IO[bytes] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``argv`` (in ``/``, in a new session), write ``spec`` pickled to its stdin,
    and return it with the first line it printed, stripped: empty when it printed none
    within ``timeout_s`` or exited first. Its stdout is closed; the caller stops it (by
    its PID) when the line is not the one it expects."""
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                         start_new_session=True, close_fds=True, cwd="/")
    assert p.stdin is not None and p.stdout is not None
    try:
        p.stdin.write(pickle.dumps(spec))
        p.stdin.close()
    except BrokenPipeError:
        pass   # died at once: its exit says why
    line, deadline = b"", time.monotonic() + timeout_s
    while not line.endswith(b"\n") and time.monotonic() < deadline:
        ready, _, _ = select.select([p.stdout], [], [], 0.2)
        if ready:
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
        elif p.poll() is not None:
            break
    p.stdout.close()
    return p, line.decode(errors="replace").strip()
