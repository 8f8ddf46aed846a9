"""``bootseer run --warm`` on one node: the job's command routed through the worker
launcher, and the node's zygote started (or kept from the last start) for it."""

from __future__ import annotations

import logging
import os
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bootseer import jobenv
from bootseer.warm import proto
from bootseer.warm.key import DIR_VAR, key_difference, socket_path, warm_key

log = logging.getLogger("bootseer.warm")
READY_WAIT_S = 120.0
_TORCHRUN = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
# this package's own name: bootseer.warm, or bootseer_warm where it is shipped into an image
_PKG = __package__ or "bootseer.warm"


@dataclass(frozen=True)
class Routed:
    """The job's command with its workers served by the launcher, and the worker command
    (the script and its arguments) the zygote is keyed on."""
    argv: list[str]
    worker: list[str]
    python: str


def route(argv: Sequence[str], env: Mapping[str, str]) -> Routed | str:
    """``torchrun OPTS train.py ARGS`` -> ``PY -m bootseer.warm.worker --launch
    torch.distributed.run -- OPTS --no-python PY -u -m bootseer.warm.worker -- train.py
    ARGS`` (torchrun itself and each of its workers forked from the zygote); ``python
    train.py ARGS`` -> ``python -m bootseer.warm.worker -- train.py ARGS``; anything else:
    why it cannot be routed."""
    argv = list(argv)
    script = next((i for i, a in enumerate(argv) if a.endswith(".py") and i > 0), None)
    if script is None:
        return "no Python script in the command (need python|torchrun ... SCRIPT.py ARGS)"
    head, worker = argv[:script], argv[script:]
    names = {os.path.basename(a) for a in head}
    if names & set(_TORCHRUN) or any(a in _TORCHRUN for a in head):
        python = shutil.which("python3", path=env.get("PATH")) or "python3"
        if os.path.basename(head[0]).startswith("python"):
            python = head[0]
        # `python -m torch.distributed.run` is torchrun itself; any other -m runs a module
        modules = [head[i + 1] for i, a in enumerate(head[:-1]) if a in ("-m", "--module")]
        if "--no-python" in head or any(m not in _TORCHRUN for m in modules):
            return "torchrun runs a module or no Python: its workers are not routed"
        if modules:   # python [FLAGS] -m torch.distributed.run OPTS
            at = head.index(modules[0])
            flags, module, opts = head[1:at - 1], modules[0], head[at + 1:]
        else:
            flags, module, opts = [], "torch.distributed.run", head[1:]
        return Routed([python, *flags, "-m", f"{_PKG}.worker", "--launch", module, "--",
                       *opts, "--no-python", python, "-u", "-m", f"{_PKG}.worker", "--",
                       *worker], worker, python)
    if len(head) == 1 and os.path.basename(head[0]).startswith("python"):
        return Routed([head[0], "-m", f"{_PKG}.worker", "--", *worker], worker, head[0])
    return f"{os.path.basename(head[0])!r} is neither python nor torchrun"


def _info(path: str) -> dict | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(path)
            proto.send(s, {"op": "info"})
            return proto.recv(s, bytearray())
    except (OSError, ValueError):
        return None


class Session:
    """The node's zygote for one run: reused when a kept one has the same key, started
    otherwise; stopped at the end unless ``keep_s`` keeps it (then it ends itself after
    ``keep_s`` idle seconds)."""

    def __init__(self, routed: Routed, env: Mapping[str, str], cwd: str, *,
                 max_rss_mb: int, keep_s: float, modules_file: str | None = None):
        self.routed, self.env, self.cwd = routed, dict(env), cwd
        self.max_rss_mb, self.keep_s = max_rss_mb, keep_s
        self.path = socket_path(routed.worker, cwd, env)
        self.modules_file = modules_file or self.path[:-len(".sock")] + ".modules"
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None

    def job_env(self) -> dict[str, str]:
        """What the job's processes get: where the capture writes the module list."""
        return {jobenv.WARM_MODULES: self.modules_file}

    def start(self) -> str:
        """Reuse or start the zygote; one line saying which (or why none)."""
        info = _info(self.path) if os.path.exists(self.path) else None
        want = warm_key(self.routed.worker, self.env, self.cwd)
        if info is not None:
            why = key_difference(info.get("key", {}), want)
            if why is None:
                self.pid = int(info["pid"])
                return f"warm: kept zygote {self.pid} ({info.get('rss_mb')} MiB)"
            self._stop_pid(int(info["pid"]))
        modules = []
        if os.path.exists(self.modules_file):
            with open(self.modules_file) as f:
                modules = [m.strip() for m in f if m.strip()]
        cmd = [self.routed.python, "-m", f"{_PKG}.zygote", "--modules", ",".join(modules),
               "--idle", str(self.keep_s), "--max-rss", str(self.max_rss_mb), "--",
               *self.routed.worker]
        self.proc = subprocess.Popen(cmd, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True, text=True)
        self.pid = self.proc.pid
        line = self._ready_line()
        if "zygote ready" not in line:
            self.close(keep=False)
            return f"warm: no zygote ({line.strip() or 'it exited'}): workers start cold"
        return f"warm: zygote {self.pid} started, {len(modules)} modules imported"

    def _ready_line(self) -> str:
        assert self.proc is not None and self.proc.stderr is not None
        deadline = time.monotonic() + READY_WAIT_S
        last = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], 0.5)
            if ready:
                last = self.proc.stderr.readline()
                if not last or "zygote ready" in last:
                    return last
            elif self.proc.poll() is not None:
                return last
        return "not ready in time"

    def memory_mb(self) -> int | None:
        info = _info(self.path)
        return None if info is None else int(info.get("rss_mb", 0))

    def close(self, keep: bool | None = None) -> str:
        """Stop the zygote unless kept; one line with the memory it holds."""
        keep = self.keep_s > 0 if keep is None else keep
        rss = self.memory_mb()
        if keep and self.pid is not None and rss is not None:
            return f"warm: zygote {self.pid} kept for {self.keep_s:g} s idle ({rss} MiB)"
        if self.pid is not None:
            self._stop_pid(self.pid)
        return f"warm: zygote stopped ({rss if rss is not None else '?'} MiB held)"

    def _stop_pid(self, pid: int) -> None:
        if self.proc is not None and self.proc.pid == pid:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            return
        # a kept zygote of an earlier run (not our child): asked to stop over its socket
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(self.path)
                proto.send(s, {"op": "stop"})
        except OSError:
            pass


def open_session(argv: Sequence[str], env: dict[str, str], cwd: str, *, max_rss_mb: int,
                 keep_s: float, dir: str, timeout_s: float) -> tuple[list[str], Session | None]:
    """The command to run and the zygote session (None: cold, said in the log); ``env``
    gets the settings the job's launchers read."""
    if dir:
        env[DIR_VAR] = dir
    env["BOOTSEER_WARM_TIMEOUT_S"] = str(timeout_s)
    routed = route(argv, env)
    if isinstance(routed, str):
        log.warning("warm: %s: workers start cold", routed)
        return list(argv), None
    session = Session(routed, env, cwd, max_rss_mb=max_rss_mb, keep_s=keep_s)
    session.env.update(session.job_env())
    said = session.start()
    log.warning("%s", said)
    if "no zygote" in said:
        return list(argv), None
    return routed.argv, session
