"""The zygote: imports the job's modules once, then forks one child per worker.

    python -m bootseer.warm.zygote [--modules a,b] [--idle S] [--max-rss MB] -- SCRIPT ARGS

It runs in the job's own environment, working directory and user, and computes its key
from them (:func:`bootseer.warm.key.warm_key`). Before every fork it checks that it is
still safe to fork (:func:`safety_problem`); a failed check is answered with the reason
and the zygote exits, since what made it unsafe (a thread, CUDA, a socket) stays.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import importlib.machinery
import io
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
import types

from bootseer.warm import proto
from bootseer.warm.key import key_difference, socket_path, warm_key

RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def rss_mb() -> int:
    """This process's resident memory in MiB (reported as what an idle zygote holds)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // (1 << 20)


# An idle zygote is what a node under memory pressure should give up first: it asks the
# OOM killer to pick it first, and ends itself when the node's available memory runs low.
PRESSURE_CHECK_S = 2.0
LOW_MEMORY_FRACTION = 0.05
"""Below this share of MemTotal available, an idle zygote ends (``--low-memory-mb``)."""
OOM_FIRST = 1000


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                out[name] = int(rest.split()[0]) // 1024   # kB -> MiB
    except (OSError, ValueError, IndexError):
        pass
    return out


def memory_low(low_mb: int) -> str | None:
    """Why the node is short of memory for an idle zygote (None: it is not). ``low_mb`` 0:
    ``LOW_MEMORY_FRACTION`` of MemTotal."""
    info = _meminfo()
    if "MemAvailable" not in info or "MemTotal" not in info:
        return None
    floor = low_mb or int(info["MemTotal"] * LOW_MEMORY_FRACTION)
    if info["MemAvailable"] < floor:
        return f"memory pressure: {info['MemAvailable']} MiB available < {floor} MiB"
    return None


def _oom_score_adj(value: int | None = None) -> int | None:
    """This process's OOM score adjustment, set to ``value`` first when given (best
    effort: None when /proc refuses)."""
    try:
        if value is not None:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(value))
        with open("/proc/self/oom_score_adj") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _children() -> set[int]:
    out: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return out


def safety_problem(own_fds: set[int], workers: set[int]) -> str | None:
    """Why this process must not fork now (None: it may). ``own_fds``: the zygote's own
    sockets (listener, launcher connections; the child closes them); ``workers``: the
    children it forked itself."""
    if threading.active_count() > 1:
        return f"a thread was started ({threading.active_count()} Python threads)"
    tasks = len(os.listdir("/proc/self/task"))
    if tasks > 1:
        return f"{tasks} OS threads (an OpenMP or native thread pool ran)"
    # a torch that is still being imported, or a stand-in, may have no cuda yet
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "CUDA was initialized"
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:") and int(name) not in own_fds:
            return f"a socket is open (fd {name})"
    strays = _children() - workers
    if strays:
        return f"child process {min(strays)} that is not a worker"
    return None


def _stdio(fd: int, name: str, env: dict[str, str], unbuffered: bool):
    unbuffered = unbuffered or bool(env.get("PYTHONUNBUFFERED"))
    raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
    if fd == 0:
        return io.TextIOWrapper(io.BufferedReader(raw), encoding=getattr(sys, name).encoding)
    buffered = io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding=getattr(sys, name).encoding,
                            errors=getattr(sys, name).errors, write_through=unbuffered,
                            line_buffering=fd == 2 or unbuffered or os.isatty(fd))


def _become(msg: dict, fds: list[int], close: list[int]) -> None:
    """In the child: take over the worker's stdio, environment, cwd and argv and run its
    script as ``__main__``; never returns."""
    code = 1
    try:
        for fd in close:
            try:
                os.close(fd)
            except OSError:
                pass
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        if len(fds) > 3 and _other_root(fds[3]):
            os.fchdir(fds[3])   # the worker's container: its mounts, not the zygote's
            os.chroot(".")
            # path entries the zygote found missing (the job's own binds) may be here
            sys.path_importer_cache.clear()
            importlib.invalidate_caches()
        for fd in fds:
            if fd > 2:
                os.close(fd)
        if msg.get("oom_score_adj") is not None:   # the worker's, not the zygote's
            _oom_score_adj(int(msg["oom_score_adj"]))
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        env = dict(msg["env"])
        os.environ.clear()
        os.environ.update(env)
        os.chdir(msg["cwd"])
        u = bool(msg.get("unbuffered"))
        sys.stdin, sys.stdout, sys.stderr = (_stdio(0, "stdin", env, u),
                                             _stdio(1, "stdout", env, u),
                                             _stdio(2, "stderr", env, u))
        _start_capture()
        argv = list(msg["argv"])
        module = msg.get("module")
        sys.argv = [module, *argv] if module else argv
        # as `python -m` puts the working directory first, `python script` its directory
        sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(argv[0]))
        if "random" in sys.modules:
            sys.modules["random"].seed()  # a cold worker seeds from the OS too
        try:
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                _run_main(argv[0])
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            traceback.print_exc()
            _flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - printed like the interpreter would
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(code & 0xFF)


def _start_capture() -> None:
    """The job's trace capture in a forked child, as the worker's own interpreter would
    have installed it at its start (sitecustomize) when the worker's environment turns it
    on: a zygote kept between containers runs without the job's trace settings. Silent on
    failure, like the capture itself; a no-op where the zygote has it installed."""
    try:
        try:
            from bootseer_shim import auto, jobenv  # shipped into the job's image
        except ImportError:
            from bootseer import jobenv
            from bootseer.trace import auto
        if jobenv.capture_on():
            auto.install()
    except Exception:  # noqa: BLE001 - tracing must never break the job
        pass


def _run_main(script: str) -> None:
    """Run ``script`` as ``python script`` would: a fresh ``__main__`` whose ``__file__`` is
    absolute while ``sys.argv[0]`` stays as given (``runpy.run_path`` would change it)."""
    path = os.path.abspath(script)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)   # the job's own script, as the job's user


def _pidns() -> int:
    """This process's PID namespace (its launcher signals the child itself when it shares
    it, and over the socket otherwise)."""
    return os.stat("/proc/self/ns/pid").st_ino


def _other_root(fd: int) -> bool:
    """The worker's root (a directory fd it passed) is not this process's own."""
    a, b = os.fstat(fd), os.stat("/")
    return (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino)


def root_problem(cwd: str) -> str | None:
    """Why this zygote's own root no longer serves (a kept zygote whose image went away)."""
    try:
        os.stat(sys.executable)
        os.listdir(cwd)
    except OSError as e:
        return f"its root is gone ({e.__class__.__name__}: {e.strerror})"
    return None


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _gone(conn: socket.socket) -> bool:
    """The launcher closed its end (its timeout passed while this one was busy)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Zygote:
    def __init__(self, path: str, key: dict[str, str], max_rss_mb: int, idle_s: float,
                 cmd: list[str] | None = None, low_memory_mb: int = 0):
        self.path, self.key, self.max_rss_mb, self.idle_s = path, key, max_rss_mb, idle_s
        self.low_memory_mb = low_memory_mb
        self.oom_adj: int | None = None   # what forked children get back (set in listen)
        self.cmd, self.cwd = list(cmd or []), os.getcwd()
        self.inode: int | None = None   # its socket's, once it listens
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, tuple[socket.socket, bytearray]] = {}
        self.pidfds: dict[int, tuple[int, socket.socket]] = {}
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.done = False

    def listen(self) -> None:
        """Take the slot (the socket a launcher looks for)."""
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.inode = os.stat(self.path).st_ino
        self.listener.listen(64)
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.oom_adj = _oom_score_adj()
        _oom_score_adj(OOM_FIRST)

    def serve(self) -> int:
        """Take workers (after :meth:`listen`) until stopped, idle or unsafe."""
        print(f"zygote ready: {self.path} ({rss_mb()} MiB)", file=sys.stderr, flush=True)
        try:
            # done (stopped, unsafe, too big): no new worker, but running ones are still
            # reaped and reported, so that their launchers end as they did
            idle_since = time.monotonic()
            while not (self.done and not self.pidfds):
                if self.done:
                    self._close_listener()
                idle = not self.conns and not self.pidfds
                now = time.monotonic()
                if not idle:
                    idle_since = now
                timeout = PRESSURE_CHECK_S if idle else None
                if idle and self.idle_s > 0:
                    timeout = max(0.0, min(PRESSURE_CHECK_S, idle_since + self.idle_s - now))
                events = self.sel.select(timeout)
                if not events and idle:
                    if self.idle_s > 0 and time.monotonic() - idle_since >= self.idle_s:
                        break
                    low = memory_low(self.low_memory_mb)
                    if low is not None:
                        print(f"zygote: dropped ({low})", file=sys.stderr, flush=True)
                        break
                for sk, _ in events:
                    self._event(sk)
        finally:
            self._close_listener()
        return 0

    def _close_listener(self) -> None:
        if self.listener.fileno() < 0:
            return
        try:   # only its own: a stopped zygote's successor may have taken the slot
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except OSError:
            pass
        self.sel.unregister(self.listener)
        self.listener.close()

    def _event(self, sk) -> None:
        if sk.data == "listen":
            conn, _ = self.listener.accept()
            if proto.peer_uid(conn) != os.getuid():
                proto.send(conn, {"ok": False, "why": "another user's zygote"})
                conn.close()
                return
            self.conns[conn.fileno()] = (conn, bytearray())
            self.sel.register(conn, selectors.EVENT_READ, "conn")
        elif sk.data == "conn":
            self._request(self.conns[sk.fd][0])
        elif isinstance(sk.data, tuple):   # a running child's launcher: a signal to relay
            self._relay(sk.fileobj, *sk.data[1:])
        else:
            pid, conn = self.pidfds.pop(sk.fd)
            self.sel.unregister(sk.fd)
            os.close(sk.fd)
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                reply = {"signal": os.WTERMSIG(status)}
            else:
                reply = {"exit": os.WEXITSTATUS(status)}
            try:
                proto.send(conn, reply)
            except OSError:
                pass
            self._drop(conn)

    def _relay(self, conn: socket.socket, pid: int, buf: bytearray) -> None:
        """Signals come over the socket: the launcher may be in another PID namespace."""
        try:
            msg = proto.recv(conn, buf)
        except (OSError, ValueError):
            msg = None
        if msg is None:
            # The launcher was killed (a SIGKILL is not relayed): so is its child, as a
            # cold worker would be, and not left running where the job cannot see it.
            self.sel.unregister(conn)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        if msg.get("op") == "signal" and msg.get("sig") in RELAYED:
            try:
                os.kill(pid, int(msg["sig"]))
            except ProcessLookupError:
                pass

    def _drop(self, conn: socket.socket) -> None:
        if conn.fileno() in self.conns:
            del self.conns[conn.fileno()]
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _request(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            msg = proto.recv(conn, self.conns[conn.fileno()][1], fds)
        except (OSError, ValueError):
            msg = None
        if msg is None or msg.get("op") != "fork" or len(fds) < 3:
            for fd in fds:
                os.close(fd)
            if msg is not None and msg.get("op") == "stop":
                self.done = True
            elif msg is not None and msg.get("op") == "info":
                # stale: the script or a config changed since the zygote started, or its
                # root went away (asked before a kept zygote is reused)
                stale = root_problem(self.cwd) or (key_difference(
                    self.key, warm_key(self.cmd, os.environ, self.cwd)) if self.cmd else None)
                proto.send(conn, {"rss_mb": rss_mb(), "pid": os.getpid(), "key": self.key,
                                  "stale": stale, "workers": len(self.pidfds)})
            if not any(c is conn for _, c in self.pidfds.values()):
                self._drop(conn)
            return
        why = key_difference(self.key, msg.get("key", {}))
        if why is None and self.max_rss_mb and rss_mb() > self.max_rss_mb:
            why = f"zygote holds {rss_mb()} MiB > warm.max_rss_mb {self.max_rss_mb}"
            self.done = True
        if why is None and len(fds) > 3 and _other_root(fds[3]) and os.geteuid() != 0:
            why = "the worker's root is another container's and this zygote cannot chroot"
        if why is None:
            own = {self.listener.fileno(), *self.conns,
                   *(c.fileno() for _, c in self.pidfds.values())}
            why = safety_problem(own, {p for p, _ in self.pidfds.values()})
            if why is not None:
                why, self.done = f"unsafe to fork: {why}", True
        if why is not None:
            for fd in fds:
                os.close(fd)
            proto.send(conn, {"ok": False, "why": why})
            self._drop(conn)
            return
        if _gone(conn):   # it gave up waiting and started cold: no second worker
            for fd in fds:
                os.close(fd)
            self._drop(conn)
            return
        _flush()
        msg["oom_score_adj"] = self.oom_adj
        pid = os.fork()
        if pid == 0:
            close = [self.listener.fileno(), *self.conns, *self.pidfds, self.sel.fileno(),
                     *(c.fileno() for _, c in self.pidfds.values())]
            _become(msg, fds, close)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.pidfds[pidfd] = (pid, conn)
        self.sel.register(pidfd, selectors.EVENT_READ, "child")
        buf = self.conns.pop(conn.fileno())[1]
        self.sel.modify(conn, selectors.EVENT_READ, ("running", pid, buf))
        proto.send(conn, {"ok": True, "pid": pid, "pidns": _pidns()})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bootseer.warm.zygote")
    p.add_argument("--modules", default="", help="comma-separated modules to import first")
    p.add_argument("--idle", type=float, default=0, help="exit after S seconds without work")
    p.add_argument("--max-rss", type=int, default=0, metavar="MB",
                   help="refuse to fork and exit once holding more than MB")
    p.add_argument("--low-memory-mb", type=int, default=0, metavar="MB",
                   help="end when idle and the node has less than MB available (default: "
                        f"{LOW_MEMORY_FRACTION:.0%} of its memory)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS (the worker command)")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("no worker command: python -m bootseer.warm.zygote -- SCRIPT ARGS")
    sys.path.insert(0, os.path.dirname(os.path.abspath(cmd[0])))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    z = Zygote(socket_path(cmd, os.getcwd()), warm_key(cmd, os.environ, os.getcwd()),
               args.max_rss, args.idle, cmd, args.low_memory_mb)
    for name in filter(None, args.modules.split(",")):
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a recorded module need not import here
            print(f"zygote: {name} not imported ({e.__class__.__name__}: {e})", file=sys.stderr)
    z.listen()   # after the imports: a worker that finds the socket is served at once
    return z.serve()


if __name__ == "__main__":
    sys.exit(main())
