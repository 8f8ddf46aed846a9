"""What the CLI says while it works: one status line per pipeline of ``bootseer run`` as it
becomes ready, progress bars on a terminal. ``-q`` silences both, ``--no-progress`` the
bars. Status goes to standard error: standard output is the command's."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

_settings = {"quiet": False, "progress": True}


def configure(*, quiet: bool, progress: bool) -> None:
    _settings["quiet"] = quiet
    _settings["progress"] = progress and not quiet


def show_progress() -> bool:
    """Progress bars: on a terminal, unless -q or --no-progress."""
    return _settings["progress"] and sys.stderr.isatty()


def say(text: str) -> None:
    if not _settings["quiet"]:
        print(text, file=sys.stderr, flush=True)


def size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def pipeline_line(name: str, kind: str, attrs: dict, seconds: float) -> str:
    """``image: lazy (fuse), 2,005 hot chunks prefetching, mounted in 1.9 s``."""
    took = f"in {seconds:.1f} s"
    if name == "image" and kind == "lazy":
        chunks = attrs.get("prefetch_chunks", 0)
        what = (f"{chunks:,} hot chunks prefetching" if chunks else
                "no hot-block profile yet (this start records one)")
        return f"image: lazy ({attrs.get('mount', 'fuse')}), {what}, mounted {took}"
    if name == "image":
        return f"image: pulled {attrs.get('image', '')} {took}".replace("  ", " ")
    if name == "deps" and kind == "restore":
        return f"deps: {attrs.get('how', 'ready')} {attrs.get('key', '')}... {took}"
    if name == "deps":
        return f"deps: installed {took}"
    if name == "ckpt" and "bytes" in attrs:
        rate = attrs["bytes"] / seconds if seconds > 0 else 0
        return f"ckpt: {size(attrs['bytes'])} copied {took}, {size(rate)}/s"
    if name == "ckpt":
        return (f"ckpt: striped mount ready {took} (files stream in once the image and "
                f"environment are ready)")
    return f"{name}: ready {took}"


def on_prepared(name: str, kind: str, attrs: dict, seconds: float) -> None:
    say(pipeline_line(name, kind, attrs, seconds))


def run_node(spec, config) -> int:
    """The node run, saying one status line per pipeline as it becomes ready."""
    from bootseer.run.node import NodeRun
    node = NodeRun(spec, config)
    node.on_prepared = on_prepared
    return node.run()


def follow(desc: str, total: float, done: Callable[[], float], finished: Callable[[float], bool],
           unit: str = "B") -> None:
    """Wait for work running in the background: ``finished(timeout)`` waits at most that
    long and says whether it is over. On a terminal (unless -q/--no-progress) a bar shows
    ``done()`` of ``total`` meanwhile; elsewhere this only waits."""
    if not show_progress():
        while not finished(1.0):
            pass
        return
    from tqdm import tqdm
    with tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", file=sys.stderr,
              dynamic_ncols=True) as bar:
        over = False
        while not over:
            over = finished(0.2)
            bar.update(max(0, min(done(), total) - bar.n))


class StageBars:
    """``progress(stage, done, total)`` as one bar per stage on a terminal (a stage's bar
    closes when the next begins; ``total`` None: bytes and rate, no percentage)."""

    def __init__(self):
        self.bar: Any = None   # a tqdm bar (tqdm carries no types)
        self.stage = None

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        if not show_progress():
            return
        if stage != self.stage:
            self.close()
            from tqdm import tqdm
            self.stage = stage
            self.bar = tqdm(total=total, desc=stage, unit="B", unit_scale=True,
                            file=sys.stderr, dynamic_ncols=True)
        if total:
            done = min(done, total)   # the pull's layout holds its index files too
        self.bar.update(max(0, done - self.bar.n))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> StageBars:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
