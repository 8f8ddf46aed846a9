"""The three startup pipelines of ``bootseer run`` (image, deps, checkpoint), each in its
bootseer flavour (``run.lazy``) or its conventional one (``run.conventional``), chosen from
the run's spec; the contract they share is ``run.pipeline``.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
from collections.abc import Collection
from pathlib import Path

from bootseer.config import BootseerConfig
from bootseer.run.conventional import PipInstall, PullImage, SingleStreamCheckpoint
from bootseer.run.lazy import LazyImage, SnapshotDeps, StripedCheckpoint
from bootseer.run.pipeline import Pipeline

log = logging.getLogger(__name__)

PIPELINE_PACKAGES = ("store", "tree", "deps", "ckpt", "mount", "image", "peers")
"""What the pipelines import, lazily, from their threads."""


OWN_PACKAGES = ("deps", "ckpt")
"""Packages only the pipeline of that name imports."""


def preload_modules(pipelines: Collection[str] | None = None) -> None:
    """Import every module of :data:`PIPELINE_PACKAGES` in the calling (main) thread,
    before the pipelines start at once in threads: two threads importing modules that
    import each other deadlock on Python's module locks (``image pipeline failed:
    deadlock detected by _ModuleLock('bootseer.store.digest')``). An optional
    extra that is not installed stays for its pipeline to report. ``pipelines``: the
    names of the pipelines this run starts (default: every one); a package of
    :data:`OWN_PACKAGES` whose pipeline does not run is not imported (a run of an image
    alone starts without the environment's and the checkpoint's modules)."""
    skip = set() if pipelines is None else set(OWN_PACKAGES) - set(pipelines)
    def load(name: str) -> None:
        try:
            importlib.import_module(name)
        except ImportError as e:
            log.debug("preload: %s not imported: %s", name, e)

    for pkg in (p for p in PIPELINE_PACKAGES if p not in skip):
        load(f"bootseer.{pkg}")
        root = sys.modules.get(f"bootseer.{pkg}")
        if root is not None:
            for info in pkgutil.walk_packages(root.__path__, f"{root.__name__}.",
                                              onerror=lambda _name: None):
                load(info.name)


def image_pipeline(spec, config: BootseerConfig, state: Path) -> Pipeline:
    if spec.image_mode == "pull":
        return PullImage(spec.image, state)
    return LazyImage(spec.image, config, state, prefetch=spec.prefetch, record=spec.record)


def deps_pipeline(spec, config: BootseerConfig, state: Path) -> Pipeline:
    prefix = spec.prefix or str(state / "env")
    if not spec.snapshot:
        return PipInstall(spec.deps, prefix, spec.python, spec.index_urls)
    return SnapshotDeps(spec.deps, prefix, spec.python, spec.index_urls, config,
                        key=spec.deps_key)


def ckpt_pipeline(spec, config: BootseerConfig, state: Path) -> Pipeline:
    if not spec.stripe:
        return SingleStreamCheckpoint(spec.ckpt, state, spec.ckpt_target)
    return StripedCheckpoint(spec.ckpt, config, state, spec.ckpt_target,
                             mirrors=tuple(spec.ckpt_mirrors))
