"""Children that die with their parent.

A long-lived child (a FUSE server, a container engine, a builder) must not outlive the
command that started it: after a SIGKILL of the command nothing runs its cleanup, and an
orphan would go on serving a mount or writing into a half-built directory. The kernel's
``PR_SET_PDEATHSIG`` sends the child a signal when its parent dies; SIGTERM by default, so
a FUSE server (libfuse handles SIGTERM) unmounts on its way out.

Use::

    p = proc.spawn(subprocess.Popen, argv, **proc.popen_kwargs())
    proc.spawn(multiprocessing_process.start)   # and, first thing in the child:
    proc.die_with_parent(parent_pid)

The kernel sends the signal when the parent *thread* ends, not the process: a child started
from a short-lived thread (a pipeline's worker) would be killed when that thread returns.
:func:`spawn` therefore starts children from the main thread or from one spawner thread
that lives as long as the process.

Only the direct child is covered; a child that daemonizes its own children (podman's
conmon) needs the next command's cleanup (``bootseer.node.alive`` state directories).
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from bootseer.node.libc import libc

_PR_SET_PDEATHSIG = 1

# Looked up once here, not in the child: a preexec function runs between fork and exec,
# where loading a library or importing a module may deadlock on a lock another thread held.
_prctl = libc.prctl


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies.

    ``parent_pid`` is the pid of the process that spawned us, read *before* the spawn: if it
    already died (we were reparented before the prctl took effect), the signal is sent now,
    closing the race between the fork and the prctl."""
    if _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def preexec(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this process
    (the caller of ``preexec``, i.e. the one about to spawn) dies."""
    parent = os.getpid()

    def _set_parent_death_signal() -> None:
        die_with_parent(parent, sig)
    return _set_parent_death_signal


def popen_kwargs(sig: int = signal.SIGTERM) -> dict[str, Any]:
    """``subprocess.Popen(argv, **popen_kwargs())``: the keyword arguments that make the
    child die with this process."""
    return {"preexec_fn": preexec(sig)}


_SPAWNER = "bootseer-spawner"
# what the spawner thread is asked: start(*args, **kwargs), its result or error into done
_Request = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Future[Any]]
_requests: queue.SimpleQueue[_Request] | None = None
_requests_lock = threading.Lock()


def _forget_spawner() -> None:   # a forked child has no spawner thread: it makes its own
    global _requests, _requests_lock
    _requests, _requests_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_spawner)


def _spawner_loop(requests: queue.SimpleQueue[_Request]) -> None:
    while True:
        start, args, kwargs, done = requests.get()
        try:
            done.set_result(start(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            done.set_exception(e)


def spawn(start: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``start(*args, **kwargs)`` (``subprocess.Popen``, ``Process.start``...) from a thread
    that outlives the child: the calling thread when it is the main thread, else the
    process's spawner thread (a daemon thread: it ends only with the process, not at the
    interpreter's exit handlers). Returns what ``start`` returns; raises what it raises."""
    global _requests
    me = threading.current_thread()
    if me is threading.main_thread() or me.name == _SPAWNER:
        return start(*args, **kwargs)
    with _requests_lock:
        if _requests is None:
            _requests = queue.SimpleQueue()
            threading.Thread(target=_spawner_loop, args=(_requests,), name=_SPAWNER,
                             daemon=True).start()
    done: Future[Any] = Future()
    _requests.put((start, args, kwargs, done))
    return done.result()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists. A child of ours that exited is reaped here first:
    a zombie looks alive to kill(pid, 0) until its parent waits for it."""
    if pid <= 0:
        return False
    try:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return False
    except ChildProcessError:
        pass   # not our child: its parent (or init) reaps it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # someone else's, but there
    return True
