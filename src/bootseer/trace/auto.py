"""Zero-code capture of a (PyTorch) training process.

Two ways in, same hooks:

- ``python -m bootseer.trace.auto train.py ARGS`` (also ``torchrun ... -m bootseer.trace.auto
  train.py``), or
- ``BOOTSEER_TRACE_AUTO=1 PYTHONPATH=$(python -m bootseer.trace.auto --site-dir)``: a
  ``sitecustomize`` hook installs the capture in every Python process that starts.

Recorded (phase names, see docs/trace.md): ``python.start`` (process creation to capture
install, i.e. interpreter start-up), ``import.<pkg>`` (each top-level package import that
takes >= 5 ms, nested imports inside it), ``dist.init`` (``init_process_group``),
``dist.first_collective`` (the first collective: barrier, all_reduce, DDP's broadcast...,
where a rank waits for the slowest) ended by a ``rendezvous`` mark (every rank leaves it at
the same instant: it aligns the nodes' clocks), ``ckpt.load`` (``torch.load``,
``torch.distributed.checkpoint.load``/``load_state_dict``), ``train.first_step`` and the
``ready`` mark after the first optimizer step (which also creates ``$BOOTSEER_READY_FILE``).
With ``$BOOTSEER_WARM_MODULES`` set (``bootseer run --warm``), the top-level modules imported
before the first collective are written to that file: the next start's zygote imports them
(docs/warm-start.md). Torch is never imported by the capture: hooks are attached when the
program itself imports it. Every hook failure is swallowed; without torch only
``python.start`` and imports are recorded.

Standard library only (and ``record``, ``jobenv``): ``bootseer run`` ships this module,
``record`` and what they import from bootseer (``jobenv``, ``redact``) as a read-only shim
into containers whose image has no bootseer (:func:`bootseer.run.tracing.write_shim`), so
it must import nothing else.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from bootseer import jobenv
from bootseer.trace import record

IMPORT_MIN_S = 0.005
_installed = False
_tls = threading.local()


def process_start_time() -> float | None:
    """Wall-clock creation time of this process (Linux /proc), None if unknown."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class _ImportTimer(importlib.abc.MetaPathFinder):
    """Times module execution of top-level packages and attaches torch hooks post-import."""

    def find_spec(self, name, path=None, target=None):
        if getattr(_tls, "busy", False):
            return None
        watch = "." not in name or name in _POST_IMPORT
        if not watch:
            return None
        _tls.busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            _tls.busy = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        orig = loader.exec_module

        def exec_module(module, _orig=orig, _name=name, _loader=loader):
            # the module keeps its real loader (isinstance checks, get_data...)
            module.__loader__ = _loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = _loader
            try:
                if "." in _name:
                    _orig(module)
                else:
                    _timed_exec(_orig, module, f"import.{_name}")
            finally:
                hook = _POST_IMPORT.get(_name)
                if hook is not None:
                    try:
                        hook(module)
                    except Exception:  # noqa: BLE001 - capture must never break the program
                        pass
        try:
            spec.loader = _Wrapped(loader, exec_module)
        except Exception:  # noqa: BLE001 - a spec that refuses it is imported untimed
            pass
        return spec


def _timed_exec(orig, module, phase: str) -> None:
    # like record.phase, but only imports >= IMPORT_MIN_S are written (hundreds are tiny)
    r = record.recorder()
    stack = r.stack()
    parent = stack[-1] if stack else None
    stack.append(phase)
    start, mono, status = time.time(), time.monotonic(), "ok"
    try:
        orig(module)
    except BaseException:
        status = "failed"
        raise
    finally:
        stack.pop()
        end, mono_end = time.time(), time.monotonic()
        if mono_end - mono >= IMPORT_MIN_S or status == "failed":
            r.write(r.event("span", phase, start, end, mono, mono_end, status, {}, parent))


class _Wrapped(importlib.abc.Loader):
    def __init__(self, loader, exec_module):
        self._loader, self._exec = loader, exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._exec(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, get_code...
        return getattr(self._loader, name)


def _mark_ours(fn: Callable[..., Any]) -> None:
    # a wrapper says so in an attribute, which a second install (or the other copy of this
    # module) checks before it wraps again; functions take attributes, Callable cannot say so
    fn._bootseer = True  # type: ignore[attr-defined]


def _wrap(obj, attr: str, phase: str, after=None, size_arg: bool = False) -> None:
    fn = getattr(obj, attr, None)
    if fn is None or getattr(fn, "_bootseer", False):
        return

    @functools.wraps(fn)
    def inner(*a, **kw):
        if phase in record.recorder().stack():  # dcp.load calls torch.load: count once
            return fn(*a, **kw)
        attrs: dict[str, object] = {}
        if size_arg and a and isinstance(a[0], (str, os.PathLike)):
            try:
                attrs["bytes"] = os.path.getsize(a[0])
                attrs["path"] = os.fspath(a[0])
            except OSError:
                pass
        with record.phase(phase, **attrs):
            out = fn(*a, **kw)
        if after:
            after()
        return out
    _mark_ours(inner)
    setattr(obj, attr, inner)


_ready_done = False


def ready() -> None:
    """The job is ready (it can train): a ``ready`` mark in the trace, and the file named
    by ``$BOOTSEER_READY_FILE`` created (``bootseer run`` then closes the hot-block
    recording window). Only the first call in a process counts."""
    global _ready_done
    if _ready_done:
        return
    _ready_done = True
    record.mark("ready")
    ready_file = jobenv.ready_file()
    if ready_file:
        try:
            open(ready_file, "a").close()
        except OSError:
            pass


def _torch(torch) -> None:
    _wrap(torch, "load", "ckpt.load", size_arg=True)
    try:
        from torch.optim import optimizer as opt
    except Exception:  # noqa: BLE001 - a torch without optimizers: no first step to time
        return
    first: tuple[float, float] | None = None   # the first step's start: wall, monotonic
    handles: list[Any] = []

    def pre(o, args, kwargs):
        nonlocal first
        if first is None:
            first = (time.time(), time.monotonic())

    def post(o, args, kwargs):
        for h in handles:
            h.remove()
        start, _ = first or (time.time(), 0)
        record.emit("train.first_step", start, time.time())
        ready()   # under `bootseer run`: ready without a line of the job's own code
    handles[:] = [opt.register_optimizer_step_pre_hook(pre),
                  opt.register_optimizer_step_post_hook(post)]


# Collectives a job may call first (DDP's constructor: _verify_params_across_processes
# and _broadcast_coalesced; FSDP: all_gather_into_tensor; DCP: the *_object gathers).
_COLLECTIVES = ("barrier", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
                "reduce", "gather", "scatter", "all_gather_object", "broadcast_object_list",
                "gather_object", "scatter_object_list", "monitored_barrier",
                "_broadcast_coalesced", "_verify_params_across_processes")


def _write_modules() -> None:
    """The top-level modules imported so far, for the next start's zygote (if asked)."""
    path = os.environ.get(jobenv.WARM_MODULES)
    if not path:
        return
    names = sorted({n.split(".")[0] for n in list(sys.modules)} - {"__main__"})
    try:
        with open(f"{path}.{os.getpid()}", "w") as f:
            f.write("".join(f"{n}\n" for n in names if not n.startswith("_")))
        os.replace(f"{path}.{os.getpid()}", path)
    except OSError:
        pass


def _first_collective(mod) -> None:
    """Time the first collective of the process: a rank waits in it until the slowest
    rank arrives (its rendezvous wait; with NCCL it also builds the communicator). All
    ranks leave it together: the ``rendezvous`` mark at its return aligns the clocks."""
    state = {"done": False}
    originals: dict[str, Callable[..., Any]] = {}
    wrappers: dict[str, Callable[..., Any]] = {}

    def wrap(name: str) -> None:
        fn = getattr(mod, name, None)
        if fn is None or getattr(fn, "_bootseer", False):
            return
        originals[name] = fn

        @functools.wraps(fn)
        def inner(*a, **kw):
            if state["done"] or "dist.first_collective" in record.recorder().stack():
                return fn(*a, **kw)
            _write_modules()
            with record.phase("dist.first_collective", op=name):
                out = fn(*a, **kw)
            state["done"] = True
            record.mark("rendezvous")
            for n, original in originals.items():   # later collectives: no wrapper at all
                if getattr(mod, n, None) is wrappers[n]:   # unless someone patched it since
                    setattr(mod, n, original)
            return out
        _mark_ours(inner)
        wrappers[name] = inner
        setattr(mod, name, inner)
    for name in _COLLECTIVES:
        wrap(name)


def _dist(mod) -> None:
    _wrap(mod, "init_process_group", "dist.init")
    _first_collective(mod)


def _dcp(mod) -> None:
    _wrap(mod, "load", "ckpt.load")
    _wrap(mod, "load_state_dict", "ckpt.load")


_POST_IMPORT = {"torch": _torch, "torch.distributed": _dist,
                "torch.distributed.checkpoint": _dcp}


def install() -> bool:
    """Install the capture in this process (idempotent). Returns False when tracing is off."""
    global _installed
    if _installed or not record.recorder().enabled:
        return _installed
    _installed = True
    started = process_start_time()
    if started is not None:
        record.emit("python.start", started, max(time.time(), started))
    sys.meta_path.insert(0, _ImportTimer())
    for name, hook in _POST_IMPORT.items():  # already imported before us
        if name in sys.modules:
            try:
                hook(sys.modules[name])
            except Exception:  # noqa: BLE001 - capture must never break the program
                pass
    return True


def site_dir() -> str:
    return os.path.join(os.path.dirname(__file__), "_site")


def main(argv: list[str] | None = None) -> int:
    import runpy
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--site-dir"]:
        print(site_dir())
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m bootseer.trace.auto SCRIPT [ARGS] | -m MODULE [ARGS] | --site-dir\n"
              "records startup phases of SCRIPT into BOOTSEER_TRACE_LOCATION", file=sys.stderr)
        return 2
    install()
    if argv[0] == "-m" and len(argv) > 1:
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
