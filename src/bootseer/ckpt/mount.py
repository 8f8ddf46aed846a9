"""``bootseer ckpt mount``: a remote checkpoint directory as a read-only FUSE view, so
torch.load, safetensors and torch.distributed.checkpoint work unchanged on it."""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
from pathlib import Path

from bootseer.config import BootseerConfig
from bootseer.mount.view import Attr

from bootseer.ckpt.engine import Engine, staged_name
from bootseer.ckpt.remote import list_files


def staging_dir(config: BootseerConfig) -> Path:
    return Path(config.cache.dir).parent / "ckpt"


def staged_mirror(url: str, config: BootseerConfig, name: str) -> Path | None:
    """If every file of ``url`` is fully staged on this node, a directory laid out as the
    checkpoint made of hard links to the staged copies (``None`` otherwise). A job started
    after the prefetch finished then reads local files, not the FUSE view."""
    staging = staging_dir(config)
    links = []
    for path, remote in list_files(url).items():
        h = staged_name(remote)
        if not (staging / f"{h}.complete").exists():
            return None
        links.append((staging / h, path.lstrip("/")))
    mirror = staging / name
    shutil.rmtree(mirror, ignore_errors=True)
    for src, rel in links:
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(src, mirror / rel)   # same filesystem as the staging copies by construction
    mirror.mkdir(parents=True, exist_ok=True)
    return mirror


class CkptView:
    def __init__(self, engine: Engine, stats_path: str | None = None):
        self.engine, self.stats_path = engine, stats_path
        self.dirs = {"/"}
        for p in engine.files:
            parts = p.split("/")[1:-1]
            for i in range(1, len(parts) + 1):
                self.dirs.add("/" + "/".join(parts[:i]))

    def getattr(self, path: str) -> Attr:
        if path in self.dirs:
            return Attr(mode=stat.S_IFDIR | 0o555, size=0, nlink=2)
        f = self.engine.files.get(path)
        if f is None:
            raise FileNotFoundError(path)
        return Attr(mode=stat.S_IFREG | 0o444, size=f.size)

    def readdir(self, path: str) -> list[str]:
        if path not in self.dirs:
            raise NotADirectoryError(path)
        prefix = path.rstrip("/") + "/"
        names = {p[len(prefix):].split("/")[0] for p in [*self.engine.files, *self.dirs]
                 if p.startswith(prefix) and p != path}
        return sorted(names)

    def readlink(self, path: str) -> str:
        raise OSError(22, "not a symlink", path)

    def read(self, path: str, size: int, offset: int) -> bytes:
        return self.engine.file(path).pread(size, offset)

    def close(self) -> None:
        if self.stats_path:
            Path(self.stats_path).write_text(json.dumps(self.engine.stats(), default=str))
        self.engine.close()


def mount_checkpoint(url: str, mountpoint: str, config: BootseerConfig, *, prefetch: bool = True,
                     mode: str = "striped", rank: int | None = None, world: int | None = None,
                     stats_path: str | None = None, memory_budget: int = 1 << 30,
                     start_after: str | None = None):
    """Serve ``url`` at ``mountpoint``; with ``prefetch`` stream every file into the node's
    staging area right away (the plan: small files first, so DCP's .metadata and
    safetensors headers land first; large files once ``start_after`` exists, if given).
    Listing errors surface here, before mounting."""
    from bootseer.mount.fuse import mount
    list_files(url)  # a wrong URL or a dead server fails here, clearly

    factory = functools.partial(build_view, url, config, memory_budget=memory_budget,
                                mode=mode, prefetch=prefetch, stats_path=stats_path,
                                start_after=start_after)
    return mount(factory, mountpoint, name="bootseer-ckpt")


def build_view(url: str, config: BootseerConfig, memory_budget: int, mode: str,
                prefetch: bool, stats_path: str | None,
                start_after: str | None = None) -> "CkptView":
    """Runs in the mount's server process."""
    engine = Engine(url, fetch=config.fetch, staging=staging_dir(config),
                    memory_budget=memory_budget, mode=mode)
    if prefetch and mode == "striped":
        engine.prefetch(start_after=start_after)
    return CkptView(engine, stats_path)
