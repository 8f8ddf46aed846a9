"""The three startup pipelines of ``bootseer run``, each in a bootseer and a conventional
flavour. A pipeline's ``prepare`` runs in its own thread (they overlap) and returns where
its result lives on the host; ``on_ready`` runs once the job reports ready; ``close``
undoes everything (unmounts, stops prefetchers) and never raises.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bootseer.config import BootseerConfig
from bootseer.errors import BootseerError
from bootseer.run import baseline

log = logging.getLogger(__name__)

PIPELINE_PACKAGES = ("store", "tree", "deps", "ckpt", "mount", "image", "peers")
"""What the pipelines import, lazily, from their threads."""


def preload_modules() -> None:
    """Import every module of :data:`PIPELINE_PACKAGES` in the calling (main) thread,
    before the pipelines start at once in threads: two threads importing modules that
    import each other deadlock on Python's module locks (bench/e2e saw ``image pipeline
    failed: deadlock detected by _ModuleLock('bootseer.store.digest')``). An optional
    extra that is not installed stays for its pipeline to report."""
    def load(name: str) -> None:
        try:
            importlib.import_module(name)
        except ImportError as e:
            log.debug("preload: %s not imported: %s", name, e)

    load("bootseer.run.lazy")
    for pkg in PIPELINE_PACKAGES:
        load(f"bootseer.{pkg}")
        root = sys.modules.get(f"bootseer.{pkg}")
        if root is not None:
            for info in pkgutil.walk_packages(root.__path__, f"{root.__name__}.",
                                              onerror=lambda _name: None):
                load(info.name)


@dataclass
class Prepared:
    path: str
    """Host path of the result: a root filesystem, an environment prefix, a checkpoint dir."""
    target: str | None = None
    """Where the command sees it inside the container (bind mount); None: not bound."""
    env_var: str | None = None
    """Environment variable that tells the command where it is."""
    attrs: dict = field(default_factory=dict)
    """Counters for the trace (bytes, hits, coverage...)."""
    image_config: dict = field(default_factory=dict)
    """An image's own settings for the command (OCI config: ``env`` list, ``workdir``)."""


class FallbackPossible(BootseerError):
    """The bootseer path failed before the command started; the conventional path may
    still work (e.g. the store is unreachable but the registry is not)."""


# Created in the node's state dir once every pipeline is prepared and settled: releases
# large background transfers (the checkpoint's data files).
PREPARED = "prepared"


class Pipeline:
    kind = "?"
    mode = "bootseer"

    def cancel(self) -> None:
        """Stop ``prepare`` early (called from another thread on SIGTERM/SIGINT)."""

    def prepare(self, timeline) -> Prepared:
        raise NotImplementedError

    def finalize(self, prepared: Prepared) -> Prepared:
        """Called once every pipeline is prepared, just before the command starts: a
        pipeline may hand over something better than what it prepared by then."""
        return prepared

    def settled(self) -> bool:
        """Done with the link for now (a lazy image: its hot blocks are local). Large
        background transfers (the checkpoint) wait for every pipeline to settle."""
        return True

    def on_ready(self) -> None:
        pass

    def fallback(self) -> "Pipeline":
        raise BootseerError(f"{self.kind} has no conventional fallback")

    def close(self) -> None:
        pass


# -- conventional paths ---------------------------------------------------------------------


class PullImage(Pipeline):
    """``podman pull`` of every layer, unpack, mount (what a container engine does)."""
    kind, mode = "pull", "baseline"

    def __init__(self, ref: str, state: Path):
        self._cancel = baseline.Cancel()
        self.image = baseline.PulledImage(ref, _short_state("bsp"), self._cancel)

    def cancel(self) -> None:
        self._cancel.cancel()

    def prepare(self, timeline) -> Prepared:
        return Prepared(path=self.image.pull(), attrs={"image": self.image.ref},
                        image_config=self.image.config())

    def close(self) -> None:
        self.image.close()


class PipInstall(Pipeline):
    """``python -m venv`` + ``pip install -r SPEC`` on every node, every start."""
    kind, mode = "install", "baseline"

    def __init__(self, spec: str, prefix: str, python: str | None, index_urls: list[str]):
        self.spec, self.prefix, self.python, self.index_urls = spec, prefix, python, index_urls
        self._cancel = baseline.Cancel()

    def cancel(self) -> None:
        self._cancel.cancel()

    def prepare(self, timeline) -> Prepared:
        baseline.pip_install(self.spec, self.prefix, python=self.python,
                             index_urls=self.index_urls, cancel=self._cancel)
        return Prepared(path=self.prefix, target=self.prefix, env_var="BOOTSEER_ENV_PREFIX")


class SingleStreamCheckpoint(Pipeline):
    """Every checkpoint file read as one sequential stream into a local directory."""
    kind, mode = "fetch", "baseline"

    def __init__(self, url: str, state: Path, target: str):
        self.url, self.dir, self.target = url, state / "local", target
        self._cancel = baseline.Cancel()

    def cancel(self) -> None:
        self._cancel.cancel()

    def prepare(self, timeline) -> Prepared:
        self.dir.mkdir(parents=True, exist_ok=True)
        n = baseline.single_stream_copy(self.url, str(self.dir), cancel=self._cancel)
        return Prepared(path=str(self.dir), target=self.target, env_var="BOOTSEER_CKPT_DIR",
                        attrs={"bytes": n})

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _short_state(prefix: str) -> str:
    # podman refuses a --runroot longer than ~50 characters: keep its state under /tmp.
    import tempfile
    return tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp")


# -- factories ------------------------------------------------------------------------------


def image_pipeline(spec, config: BootseerConfig, state: Path) -> Pipeline:
    if spec.image_mode == "pull":
        return PullImage(spec.image, state)
    from bootseer.run.lazy import LazyImage
    return LazyImage(spec.image, config, state, prefetch=spec.prefetch, record=spec.record)


def deps_pipeline(spec, config: BootseerConfig, state: Path) -> Pipeline:
    prefix = spec.prefix or str(state / "env")
    if not spec.snapshot:
        return PipInstall(spec.deps, prefix, spec.python, spec.index_urls)
    from bootseer.run.lazy import SnapshotDeps
    return SnapshotDeps(spec.deps, prefix, spec.python, spec.index_urls, config,
                        key=spec.deps_key)


def ckpt_pipeline(spec, config: BootseerConfig, state: Path) -> Pipeline:
    if not spec.stripe:
        return SingleStreamCheckpoint(spec.ckpt, state, spec.ckpt_target)
    from bootseer.run.lazy import StripedCheckpoint
    return StripedCheckpoint(spec.ckpt, config, state, spec.ckpt_target,
                             mirrors=tuple(spec.ckpt_mirrors))
