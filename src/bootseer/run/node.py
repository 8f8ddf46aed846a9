"""One node's start: overlap the three pipelines, run the command, watch for ready.

    image  ─┐
    deps   ─┼─> container(CMD) ──> ready file touched ──> close recording, publish profile
    ckpt   ─┘

Each pipeline has a bootseer path and the conventional path (``--no-prefetch``,
``--no-snapshot``, ``--no-stripe``, or ``--baseline`` for all three). When the bootseer
path fails before the command starts (the store is down, say), the pipeline falls back to
the conventional path where one exists and says so: a start that works slowly beats a
start that fails. Every phase goes to the trace; the per-phase timings also go to a small
JSON summary that the demo and the e2e benchmark read.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer import trace
from bootseer.config import BootseerConfig
from bootseer.errors import BootseerError
from bootseer.node import alive, outputs
from bootseer.node import proc as procs
from bootseer.run import baseline, inroot, tracing, warmkeep
from bootseer.run import container as C
from bootseer.run import pipelines as P
from bootseer.run.pipeline import PREPARED, FallbackPossible, Pipeline, Prepared
from bootseer.warm import ship
from bootseer.warm.session import Session, open_session

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable

log = logging.getLogger(__name__)

READY_DIR = "/run/bootseer"


@dataclass
class RunSpec:
    argv: list[str]
    image: str | None = None
    """Image to run CMD in: a registry reference (``host:port/repo:tag``) or a tree ref."""
    image_mode: str = "lazy"
    """``lazy``: FUSE mount of the converted tree; ``pull``: podman pull + unpack."""
    prefetch: bool = True
    """Prefetch the image's recorded hot blocks (lazy mode)."""
    record: bool = True
    """Record this start's hot blocks and publish them at ready (lazy mode)."""
    deps: str | None = None
    deps_key: str | None = None
    """Environment key resolved once per job ('bootseer deps key'): cold nodes restore
    without resolving, warm nodes return at once."""
    prefix: str | None = None
    python: str | None = None
    index_urls: list[str] = field(default_factory=list)
    snapshot: bool = True
    ckpt: str | None = None
    ckpt_target: str = "/ckpt"
    ckpt_mirrors: list[str] = field(default_factory=list)
    stripe: bool = True
    fallback: str = "pull"
    """When a fast path is unavailable (an image never converted, no snapshot): ``pull``
    takes the conventional one (podman pull, pip install), said in the log and trace;
    ``never`` fails the run instead."""
    binds: list[C.Bind] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    """CMD's working directory; None: the image's WorkingDir, else ``/``."""
    runtime: str = "auto"
    network: str = "host"
    """The container's network: the node's (``host``), ``none``, ``ns:PATH``, a podman mode."""
    gpus: str = "auto"
    """``all``, ``none``, ``auto`` (those present) or indices ``0,1`` (run/devices.py)."""
    shm_size: int | None = None
    """A private /dev/shm of this many bytes; None: the host's IPC namespace."""
    ready_timeout_s: float | None = None
    ready_regex: str | None = None
    """Ready at the first line of CMD's output (stdout or stderr) matching this."""
    summary: str | None = None
    """Write per-phase timings (JSON) here when the run ends."""
    state_dir: str | None = None
    warm: bool = False
    """Serve the job's Python workers from the node's zygote (docs/warm-start.md)."""


@dataclass(frozen=True)
class PhaseTime:
    """One phase of the start in the summary file: seconds from the node's start, and the
    phase's plain attributes (bytes, how...)."""
    start: float
    end: float
    status: str = "ok"
    attrs: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"start": self.start, "end": self.end, "status": self.status, **self.attrs}


class Timeline:
    """Per-phase wall-clock offsets from the node's start, for the summary file."""

    def __init__(self) -> None:
        self.t0 = time.time()
        self.phases: dict[str, PhaseTime] = {}
        self.lock = threading.Lock()

    def phase(self, name: str, **attrs):
        timeline = self

        class _Span:
            def __enter__(self_inner):
                self_inner.start = time.time()
                self_inner.cm = trace.phase(name, **attrs)
                self_inner.span = self_inner.cm.__enter__()
                return self_inner

            def set(self_inner, **more):
                attrs.update(more)
                self_inner.span.set(**more)

            def __exit__(self_inner, et, ev, tb):
                end = time.time()
                with timeline.lock:
                    timeline.phases[name] = PhaseTime(
                        self_inner.start - timeline.t0, end - timeline.t0,
                        "ok" if et is None else "failed",
                        {k: v for k, v in attrs.items() if isinstance(v, (int, float, str, bool))})
                return self_inner.cm.__exit__(et, ev, tb)

        return _Span()

    def to_json(self) -> dict:
        return {"t0": self.t0, "phases": {n: p.to_json() for n, p in self.phases.items()}}


STATE_PREFIX, ALIVE = "bsn-", alive.MARK


def sweep_dead_states(tmp: str = alive.STATE_ROOT) -> list[str]:
    """Remove what commands that died without cleaning up (SIGKILL, OOM) left on the node:
    their state directories, mounts and containers (bootseer.node.alive). Returns the
    directories removed; a live command's are kept."""
    return alive.sweep_dead(tmp)


class NodeRun:
    def __init__(self, spec: RunSpec, config: BootseerConfig | None = None):
        self.spec = spec
        self.config = config or BootseerConfig.from_env()
        self.timeline = Timeline()
        self._owns_state = spec.state_dir is None
        self._state_dir: alive.StateDir | None = None
        if spec.state_dir is None:   # ours: held until we exit; the next run sweeps a dead one's
            self._state_dir = alive.StateDir(STATE_PREFIX)
            self.state = self._state_dir.path
        else:
            self.state = Path(spec.state_dir)
        self.state.mkdir(parents=True, exist_ok=True)
        self.pipelines: list[Pipeline] = []
        self.ready_at: float | None = None
        self._running: C.Running | None = None
        self._proc: subprocess.Popen | None = None
        self._warm: Session | warmkeep.Kept | None = None
        self._runtime, self._options = spec.runtime, C.Options()
        # told of each pipeline as it becomes ready: (name, kind, attrs, seconds)
        self.on_prepared: Callable[[str, str, dict, float], None] | None = None
        """Called ``(name, kind, attrs, seconds)`` as each pipeline is ready (the CLI's
        status line)."""

    # -- pipelines ---------------------------------------------------------------------------
    def _make_pipelines(self) -> dict[str, Pipeline]:
        s, made = self.spec, {}
        if s.image:
            made["image"] = P.image_pipeline(s, self.config, self.state / "image")
        if s.deps:
            made["deps"] = P.deps_pipeline(s, self.config, self.state / "deps")
        if s.ckpt:
            made["ckpt"] = P.ckpt_pipeline(s, self.config, self.state / "ckpt")
        for pipeline in made.values():
            self._note_outside(pipeline)
        return made

    def _note_outside(self, pipeline: Pipeline) -> None:
        """A pulled image's podman storage lies outside the run's state (podman refuses a
        long path): if this run dies, the next command unmounts and removes it."""
        image = getattr(pipeline, "image", None)
        if isinstance(image, baseline.PulledImage):
            self._note_dir(image.state_dir, image.unmount_all_command())

    def _prepare(self) -> dict[str, Prepared]:
        """Run the pipelines at once, each in a daemon thread: on SIGTERM the main thread
        stops waiting, cancels them and cleans up without joining a stuck download."""
        pipelines = self._make_pipelines()
        self.pipelines = list(pipelines.values())
        P.preload_modules(pipelines)
        results: dict[str, Prepared] = {}
        errors: list[tuple[str, BaseException]] = []
        self._final: dict[str, Pipeline] = {}   # per name, after any fallback

        def work(name: str, pipeline: Pipeline) -> None:
            try:
                results[name] = self._prepare_one(name, pipeline)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append((name, e))

        threads = [threading.Thread(target=work, args=item, daemon=True,
                                    name=f"bootseer-{item[0]}") for item in pipelines.items()]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.1)
        except BaseException:
            for p in self.pipelines:
                p.cancel()
            raise
        if errors:
            name, err = errors[0]
            raise RunError(f"{name} pipeline failed: {err}") from err
        threading.Thread(target=self._release_background, daemon=True,
                         name="bootseer-settle").start()
        for name, prepared in list(results.items()):
            results[name] = self._final[name].finalize(prepared)
        return results

    def _release_background(self, max_wait_s: float = 60.0) -> None:
        """Once every pipeline has settled (or after ``max_wait_s``), release the large
        background transfers (the checkpoint's data files)."""
        deadline = time.monotonic() + max_wait_s
        while time.monotonic() < deadline:
            try:
                if all(p.settled() for p in self._final.values()):
                    break
            except OSError:
                break
            time.sleep(0.05)
        try:
            (self.state / PREPARED).touch()
        except OSError:  # the node is shutting down
            pass

    def _prepare_one(self, name: str, pipeline: Pipeline) -> Prepared:
        self._final[name] = pipeline
        started = time.monotonic()
        with self.timeline.phase(f"{name}.{pipeline.kind}", mode=pipeline.mode) as span:
            try:
                prepared = pipeline.prepare(self.timeline)
            except FallbackPossible as e:
                if self.spec.fallback == "never":
                    raise RunError(f"{e}; not falling back (--fallback never)") from e
                log.warning("%s: %s; falling back to the conventional path", name, e)
                span.set(fallback=str(e)[:200])
                replacement = pipeline.fallback()
                self._note_outside(replacement)
                self.pipelines[self.pipelines.index(pipeline)] = replacement
                self._final[name] = replacement
                prepared = replacement.prepare(self.timeline)
            span.set(**prepared.attrs)
            if self.on_prepared is not None:
                self.on_prepared(name, self._final[name].kind, prepared.attrs,
                                 time.monotonic() - started)
            return prepared

    # -- the command -------------------------------------------------------------------------
    def _command_env(self, prepared: dict[str, Prepared], ready_file: str,
                     in_container: bool) -> dict[str, str]:
        env = {"BOOTSEER_READY_FILE": ready_file}
        for p in prepared.values():
            if p.env_var:
                env[p.env_var] = p.target if (in_container and p.target) else p.path
        env.update(self.spec.env)
        return env

    def _watch_ready(self, ready_host_path: Path, stop: threading.Event) -> None:
        while True:  # one last look after stop: a command may signal ready and exit at once
            done = stop.is_set()
            if ready_host_path.exists():
                self.ready_at = time.time()
                trace.mark("ready")
                with self.timeline.lock:
                    at = self.ready_at - self.timeline.t0
                    self.timeline.phases["ready"] = PhaseTime(at, at)
                for p in self.pipelines:
                    try:
                        p.on_ready()
                    except Exception as e:  # noqa: BLE001 - never fails the job
                        log.warning("after ready: %s", e)
                return
            if done:
                return
            stop.wait(0.05)

    def _output_pipes(self) -> dict:
        """With --ready-regex, CMD's output comes through us (to be matched); else it is
        CMD's own, untouched."""
        import subprocess
        if not self.spec.ready_regex:
            return {}
        return {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}

    def _pump_output(self, proc, ready_file: Path) -> list[threading.Thread]:
        """Copy CMD's stdout and stderr to ours line by line; the first line matching
        --ready-regex creates the ready file (the watcher then marks ready, closes the
        recording window and publishes the profile, as when CMD creates it)."""
        if not self.spec.ready_regex:
            return []
        import re
        pattern, seen = re.compile(self.spec.ready_regex), threading.Event()

        def pump(stream, out) -> None:
            for line in iter(stream.readline, b""):
                out.write(line)
                out.flush()
                if not seen.is_set() and pattern.search(line.decode(errors="replace")):
                    seen.set()
                    ready_file.touch()
            stream.close()
        threads = [threading.Thread(target=pump, args=(stream, out), daemon=True,
                                    name="bootseer-output")
                   for stream, out in ((proc.stdout, sys.stdout.buffer),
                                       (proc.stderr, sys.stderr.buffer))]
        for t in threads:
            t.start()
        return threads

    def _warm_in_image(self, image: Prepared, workdir: str, env: dict[str, str],
                       binds: list[C.Bind]) -> tuple[list[str], list[C.Bind]]:
        """A zygote kept between containers (keep_s > 0, chroot), else in the job's."""
        s, w = self.spec, self.config.warm
        kept = warmkeep.prepare(w, rootfs=image.path, image=s.image or "", argv=s.argv, env=env,
                                workdir=workdir, binds=binds, attrs=image.attrs,
                                options=self._options, runtime=self._runtime,
                                per_run=str(self.state), config=self.config)
        if kept is not None:   # closed (prepared for the next start) as a Session is
            self._warm = kept
            return kept.argv, kept.binds
        argv, more = ship.in_container(self.state / "warmpkg", w, s.image or "", s.argv, env)
        return argv, [C.Bind(src, dst, readonly=ro) for src, dst, ro in more]

    def _launch(self, prepared: dict[str, Prepared]) -> int:
        s = self.spec
        signal_dir = self.state / "signal"
        signal_dir.mkdir(exist_ok=True)
        image = prepared.get("image")
        waiter: Callable[[], int]          # the command's exit status, once it exits
        forward: Callable[[int], None]     # a signal to the command
        if image is not None:
            # the image's own Env and WorkingDir, as a container engine applies them
            # (bootseer's variables and --env win); CMD replaces Entrypoint + Cmd
            img_env = dict(kv.split("=", 1) for kv in image.image_config.get("env") or []
                           if "=" in kv)
            workdir = s.workdir or image.image_config.get("workdir") or "/"
            # resolved as inside the container: never through `..` or a link onto the host
            if not inroot.has_command(image.path, s.argv[0],
                                      img_env.get("PATH") or inroot.DEFAULT_PATH, workdir):
                print(f"bootseer: error: command {s.argv[0]!r} not found in image {s.image}",
                      file=sys.stderr)
                return C.EXIT_NOT_FOUND
            binds = [C.Bind(str(signal_dir), READY_DIR, readonly=False)]
            binds += [C.Bind(p.path, p.target) for p in prepared.values() if p.target]
            trace_env, trace_binds = tracing.job_setup(
                self.config.trace, self.state, in_container=True, image_env=img_env,
                gpus=self._options.devices.gpus)
            binds += trace_binds + s.binds
            env = {**img_env, **trace_env,
                   **self._command_env(prepared, f"{READY_DIR}/ready", in_container=True)}
            tracing.keep_capture(env, trace_env, s.env)
            argv = s.argv
            if s.warm:   # a kept zygote, or one in the job's container (docs/warm-start.md)
                try:
                    argv, more = self._warm_in_image(image, workdir, env, binds)
                    binds += more
                except PermissionError as e:
                    log.warning("warm: %s: workers start cold", e)
            container = C.Container(rootfs=image.path, argv=argv, workdir=workdir,
                                    env=env, binds=binds, options=self._options)
            self._running = C.start(container, runtime=self._runtime, on_state=self._note_dir,
                                    **self._output_pipes())
            waiter, forward = self._running.wait, self._running.send_signal
            pumps = self._pump_output(self._running.proc, signal_dir / "ready")
        else:
            import subprocess
            trace_env, _ = tracing.job_setup(self.config.trace, self.state, in_container=False)
            env = {**os.environ, **trace_env,
                   **self._command_env(prepared, str(signal_dir / "ready"), in_container=False)}
            tracing.keep_capture(env, trace_env, s.env)
            argv = s.argv
            if s.warm:
                argv, self._warm = open_session(s.argv, env, s.workdir or os.getcwd(),
                                                **dataclasses.asdict(self.config.warm))
                env.update(self._warm.job_env() if self._warm else {})
            try:
                proc = procs.spawn(subprocess.Popen, argv, env=env, cwd=s.workdir,
                                   **procs.popen_kwargs(), **self._output_pipes())
            except FileNotFoundError:
                print(f"bootseer: error: command {s.argv[0]!r} not found", file=sys.stderr)
                return C.EXIT_NOT_FOUND
            self._proc = proc
            pumps = self._pump_output(proc, signal_dir / "ready")
            waiter = lambda: (lambda rc: 128 - rc if rc < 0 else rc)(proc.wait())  # noqa: E731
            forward = proc.send_signal
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch_ready, args=(signal_dir / "ready", stop),
                                   daemon=True)
        watcher.start()
        forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {sg: signal.signal(sg, lambda n, _f: forward(n)) for sg in forwarded}
        try:
            with self.timeline.phase("job.run"):
                rc = waiter()
        finally:
            for t in pumps:   # the command's last lines are out before we say anything
                t.join(5)
            for sg, h in previous.items():
                signal.signal(sg, h)
            stop.set()
            watcher.join(5)
            if self._running is not None:
                self._running.kill()
            if self._warm is not None:
                log.warning("%s", self._warm.close())
        return rc

    # -- the whole start ---------------------------------------------------------------------
    def run(self) -> int:
        """Prepare, run CMD, clean up (unmount, stop helpers) whatever happens."""
        stop_on_term = _TermToInterrupt()
        try:
            if self.spec.image:   # a container that cannot be set up fails before any mount
                self._runtime, self._options = C.training_options(
                    self.spec.runtime, network=self.spec.network, gpus=self.spec.gpus,
                    shm_size=self.spec.shm_size)
            with stop_on_term, self.timeline.phase("startup.prepare"):
                prepared = self._prepare()
            return self._launch(prepared)
        finally:
            for p in reversed(self.pipelines):
                try:
                    p.close()
                except Exception as e:  # noqa: BLE001 - cleanup goes on
                    log.warning("cleanup: %s", e)
            self._write_summary()
            if self._state_dir is not None:
                self._state_dir.close()

    def _note_dir(self, path: str, undo: list[str] | None) -> None:
        """If this run dies (SIGKILL) the next command runs ``undo`` (removes the containers
        podman's conmon keeps running), unmounts what is under ``path`` and removes it."""
        if self._state_dir is not None:
            self._state_dir.note_dir(path, undo)

    def _write_summary(self) -> None:
        if not self.spec.summary:
            return
        data = self.timeline.to_json()
        data["ready_s"] = (self.ready_at - self.timeline.t0) if self.ready_at else None
        if self.spec.summary == "-":
            print(json.dumps(data, indent=1), flush=True)
            return
        # the user's path: written in place, never renamed over
        outputs.write_text(self.spec.summary, json.dumps(data, indent=1), "summary")


class RunError(BootseerError):
    pass


class _TermToInterrupt:
    """While preparing, SIGTERM raises KeyboardInterrupt so the ``finally`` that unmounts
    runs (Python's default SIGTERM action would skip it)."""

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        return False
