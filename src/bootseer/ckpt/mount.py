"""``bootseer ckpt mount``: a remote checkpoint directory as a read-only FUSE view, so
torch.load, safetensors and torch.distributed.checkpoint work unchanged on it; and the
staged mirror a job reads instead once the prefetch has staged every file.

Served by devfuse where the kernel offers passthrough (a staged file is then read by the
kernel from its staging copy), else by mfusepy (``ckpt.fuse``; see docs/ckpt.md)."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
from pathlib import Path

from bootseer.ckpt import credentials, share
from bootseer.ckpt.engine import Engine
from bootseer.ckpt.listing import RemoteDir
from bootseer.ckpt.staging import StagingArea, node_staging_dir
from bootseer.ckpt.view import RemoteDirView
from bootseer.config import BootseerConfig
from bootseer.mount.serve import serve_files

staging_dir = node_staging_dir


def staged_mirror(url: str, config: BootseerConfig, name: str) -> Path | None:
    """If every file of ``url`` is fully staged on this node, a directory laid out as the
    checkpoint made of hard links to the staged copies (``None`` otherwise). A job started
    after the prefetch finished then reads local files, not the FUSE view."""
    area = StagingArea(node_staging_dir(config), mode=config.ckpt.staging_mode)
    links = []
    for rel, source in RemoteDir(url).walk().items():
        if not area.is_complete(source.key):
            return None
        links.append((area.path(source.key), rel))
    mirror = area.dir / name
    shutil.rmtree(mirror, ignore_errors=True)
    mirror.mkdir(parents=True)
    if area.private_for(credentials.carried(url)):   # its names are the checkpoint's
        os.chmod(mirror, 0o700)
    try:
        for src, rel in links:
            (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
            os.link(src, mirror / rel)   # same filesystem as the staging copies by construction
    except FileNotFoundError:   # `ckpt gc` removed a copy meanwhile: read through the view
        shutil.rmtree(mirror, ignore_errors=True)
        return None
    return mirror


def build_view(url: str, config: BootseerConfig, memory_budget: int | None = None,
               mode: str = "striped", prefetch: bool = True, stats_path: str | None = None,
               start_after: str | None = None, rank: int | None = None,
               world: int | None = None, mirrors: tuple[str, ...] = ()) -> RemoteDirView:
    """The mount's view; runs in the mount's server process. With ``prefetch`` (striped
    mode), the checkpoint starts streaming into the node's staging area at once;
    ``mirrors``: base URLs of exact copies of ``url`` (hedged reads, failover)."""
    ckpt = config.ckpt if memory_budget is None else dataclasses.replace(
        config.ckpt, memory_budget_bytes=memory_budget)
    engine = Engine(ckpt, config.fetch, staging=str(node_staging_dir(config)),
                    store_url=config.store.url)
    node_reads = None
    if prefetch and mode == "striped" and world is None and \
            share.applies(config.ckpt.stage, config.peers.nodes):
        node_reads = share.NodeReads(
            engine.staging.dir, url, auto=config.ckpt.stage == "auto",
            private=engine.staging.private_for(credentials.carried(url)))
    try:
        view = RemoteDirView(RemoteDir(url, mirrors=mirrors), engine, mode=mode,
                             stats_path=stats_path, node_reads=node_reads)
        if prefetch and mode == "striped":
            from bootseer.ckpt.prefetch import start_plan_soon
            start_plan_soon(engine, view.remote, rank=rank, world=world,
                            start_after=start_after, config=config, node_reads=node_reads)
    except BaseException:
        engine.close()
        raise
    return view


def mount_checkpoint(url: str, mountpoint: str, config: BootseerConfig, *, prefetch: bool = True,
                     mode: str = "striped", rank: int | None = None, world: int | None = None,
                     stats_path: str | None = None, memory_budget: int | None = None,
                     start_after: str | None = None, mirrors: tuple[str, ...] = ()):
    """Serve ``url`` at ``mountpoint`` (returns the mount handle); see :func:`build_view`.
    A wrong URL, a dead server, a mirror holding other files or a budget below one stripe
    fails here, before mounting."""
    RemoteDir(url, mirrors=mirrors).check_root()
    factory = functools.partial(build_view, url, config, memory_budget=memory_budget,
                                mode=mode, prefetch=prefetch, stats_path=stats_path,
                                start_after=start_after, rank=rank, world=world,
                                mirrors=tuple(mirrors))
    return serve_files(config, factory, mountpoint, name="bootseer-ckpt")
