"""The bootseer flavours of the three pipelines: lazy image with hot-block record and
prefetch, dependency snapshot restore, striped checkpoint reads with plan prefetch."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

from bootseer import trace
from bootseer.config import BootseerConfig
from bootseer.errors import MountError, StoreError
from bootseer.image.session import mount_image, oci_config
from bootseer.run.conventional import PipInstall, PullImage
from bootseer.run.pipeline import PREPARED, FallbackPossible, Pipeline, Prepared
from bootseer.tree import profile as prof
from bootseer.tree.session import PREFETCHED, window_attrs

log = logging.getLogger(__name__)


class LazyImage(Pipeline):
    kind = "lazy"

    def __init__(self, ref: str, config: BootseerConfig, state: Path, *, prefetch: bool = True,
                 record: bool = True):
        self.ref, self.config, self.state, self.prefetch = ref, config, state, prefetch
        self.record = record
        self.handle = None
        self.rec_dir = state / "recording"
        self.tree = None
        self.published: str | None = None

    def prepare(self, timeline) -> Prepared:
        rootfs = self.state / "rootfs"
        rootfs.mkdir(parents=True, exist_ok=True)
        try:
            self.handle, self.tree, profile, meta = mount_image(
                self.config, self.ref, str(rootfs), str(self.rec_dir), record=self.record,
                prefetch=self.prefetch)
        except StoreError as e:
            raise FallbackPossible(f"lazy image unavailable ({e})") from e
        return Prepared(path=str(rootfs), attrs={
            "tree": self.tree, "prefetch_chunks": len(profile["chunks"]) if profile else 0,
            "mount": getattr(self.handle, "backend", "fuse")},   # erofs-local / -fuse-blob
            image_config=oci_config(meta))

    def fallback(self) -> Pipeline:
        return PullImage(self.ref, self.state)

    def settled(self) -> bool:
        return (self.rec_dir / PREFETCHED).exists()

    def on_ready(self) -> None:
        """Close the recording window; publish this start's profile (merged with the
        previous one) so the next start prefetches."""
        (self.rec_dir / "close-window").touch()
        figures = self.rec_dir / "figures.json"
        deadline = time.time() + 15
        while not figures.exists() and time.time() < deadline:
            time.sleep(0.05)
        if figures.exists():
            data = json.loads(figures.read_text())
            trace.mark("image.window", **window_attrs(data))
            (self.state.parent / "image-figures.json").write_text(json.dumps(data))
        self._publish()

    def _publish(self) -> None:
        if not self.record:
            return
        self.published = prof.publish_recorded(self.config, str(self.rec_dir / "profile.json"))

    def close(self) -> None:
        if self.handle is not None:
            self.handle.unmount()


class SnapshotDeps(Pipeline):
    kind = "restore"

    def __init__(self, spec: str, prefix: str, python: str | None, index_urls: list[str],
                 config: BootseerConfig, key: str | None = None):
        self.spec, self.prefix, self.python = spec, prefix, python
        self.index_urls, self.config, self.key = index_urls, config, key

    def prepare(self, timeline) -> Prepared:
        # imported here: a run without --deps (an image alone) starts without them
        from bootseer.deps.ensure import ensure
        try:
            result = ensure(self.spec, self.prefix, python=self.python, key=self.key,
                            index_urls=self.index_urls, config=self.config)
        except StoreError as e:
            raise FallbackPossible(f"dependency snapshot unavailable ({e})") from e
        return Prepared(path=self.prefix, target=self.prefix, env_var="BOOTSEER_ENV_PREFIX",
                        attrs={"how": result.how, "key": result.key[:19]})

    def fallback(self) -> Pipeline:
        return PipInstall(self.spec, self.prefix, self.python, self.index_urls)


class StripedCheckpoint(Pipeline):
    kind = "stripe"

    def __init__(self, url: str, config: BootseerConfig, state: Path, target: str, *,
                 mirrors: tuple[str, ...] = ()):
        self.url, self.config, self.state, self.target = url, config, state, target
        self.mirrors = mirrors
        self.handle = None
        self.mirror: Path | None = None

    def prepare(self, timeline) -> Prepared:
        # imported here: a run without --ckpt starts without it
        from bootseer.ckpt.mount import mount_checkpoint
        mp = self.state / "mnt"
        mp.mkdir(parents=True, exist_ok=True)
        # Large files wait for the node's "prepared" signal (environment restored, image
        # hot blocks local): the checkpoint is read only after the job imported its code,
        # and streaming it earlier delays the image's reads behind it on the link.
        # Not a rank's share (ckpt.plan.split divides one node's copy among processes that
        # share its staging): a job of two or more nodes stages what this node's ranks
        # read (ckpt/share.py, ckpt.stage), a one-node job every file.
        try:
            self.handle = mount_checkpoint(self.url, str(mp), self.config, prefetch=True,
                                           start_after=str(self.state.parent / PREPARED),
                                           mirrors=self.mirrors)
        except MountError as e:
            # No mount for this user (FUSE closed to it), but the checkpoint was staged
            # whole before the command (the Slurm prolog's ckpt prefetch): its local files.
            staged = self._staged({})
            if staged is None:
                raise
            log.warning("checkpoint mount unavailable (%s): the staged copy is used", e)
            return staged
        return Prepared(path=str(mp), target=self.target, env_var="BOOTSEER_CKPT_DIR")

    def finalize(self, prepared: Prepared) -> Prepared:
        """Prefetch already done when the command starts: give it the staged files (hard
        links, local reads) instead of the FUSE view, which stays mounted but idle."""
        if self.mirror is not None:   # prepared from the staged files already
            return prepared
        return self._staged(prepared.attrs) or prepared

    def _staged(self, attrs: dict) -> Prepared | None:
        from bootseer.ckpt.mount import staged_mirror
        try:
            self.mirror = staged_mirror(self.url, self.config, f"mirror-{os.getpid()}")
        except (OSError, StoreError) as e:
            log.info("checkpoint stays on the striped mount: %s", e)
            return None
        if self.mirror is None:
            return None
        trace.mark("ckpt.staged", path=str(self.mirror))
        return Prepared(path=str(self.mirror), target=self.target, env_var="BOOTSEER_CKPT_DIR",
                        attrs=attrs)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.unmount()
        if self.mirror is not None:
            shutil.rmtree(self.mirror, ignore_errors=True)

