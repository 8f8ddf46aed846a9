"""Publishing and unpublishing inline volumes: what the Node service does, without gRPC.

- An environment: the store's snapshot for the key, restored at the target path through
  ``bootseer.deps`` as a read-only kernel mount (EROFS on the snapshot's blob in the node
  cache), or an extracted copy where the kernel has no file-backed EROFS. The pod mounts
  the volume at the environment's own prefix (its ``mountPath``), so nothing is relocated:
  the target path on the node is never a path the environment's files name.
- A checkpoint: the remote directory served striped at the target path through
  ``bootseer.ckpt`` (a FUSE server this process spawned, plan prefetch into the node's
  staging area). It lives as long as this process: a plugin restart ends it.

Every volume is recorded, before anything is mounted, in ``<state>/volumes/`` (one JSON
file per target path): a publish repeated for the same volume and source finds it and
returns at once (the kubelet retries), one for another source is refused, and an
unpublish undoes what the record names and nothing else, even after a restart.

An environment still being built (its key has no snapshot yet, and the builder's lease in
the store is live) is waited for up to ``build_wait_s``, then refused as retriable
(``EnvironmentBuilding``, gRPC UNAVAILABLE): the kubelet calls again with back-off until
the builder publishes. A key that nobody builds is NOT_FOUND, said with the hint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bootseer.ckpt.mount import mount_checkpoint
from bootseer.config import BootseerConfig
from bootseer.csi.attributes import CheckpointVolume, EnvironmentVolume, Volume, check_target
from bootseer.deps.lease import lease_ref
from bootseer.deps.mounts import unmount as unmount_env
from bootseer.deps.prefix import marker_of, mounted_info, rmtree, sidecar, write_json
from bootseer.deps.restore import restore
from bootseer.deps.snapshot import check_driver, env_ref, load_manifest
from bootseer.errors import BootseerError
from bootseer.mount.handle import MountHandle
from bootseer.node import mounts
from bootseer.store import open_store
from bootseer.store.backend import Backend

log = logging.getLogger(__name__)
_POLL_S = 0.5   # how often a publish waiting on a build asks the store


class EnvironmentBuilding(BootseerError):
    """The environment's key has no snapshot yet and its builder holds the lease: the
    publish is to be retried (gRPC UNAVAILABLE)."""


class EnvironmentNotFound(BootseerError, FileNotFoundError):
    """No snapshot for the key, and nobody builds it (gRPC NOT_FOUND)."""


class VolumeConflict(BootseerError):
    """The target path holds another volume, or a mount bootseer did not make there
    (gRPC ALREADY_EXISTS / FAILED_PRECONDITION)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The node plugin's settings (``bootseer csi serve`` flags)."""

    state_dir: str
    """Where the volumes' records are kept (one JSON file per target path)."""
    kubelet_dir: str
    """The kubelet's root directory: every target path lies under its ``pods/``."""
    build_wait_s: float = 30.0
    """Seconds a publish waits on an environment being built before it answers
    UNAVAILABLE (the kubelet's own call times out after two minutes)."""
    allowed_checkpoint_prefixes: tuple[str, ...] = ()
    """URL prefixes a checkpoint volume must start with (empty: any remote URL)."""


def _fingerprint(source: EnvironmentVolume | CheckpointVolume) -> str:
    """What a volume holds, as recorded: a URL may carry a token, so only its hash."""
    if isinstance(source, EnvironmentVolume):
        return f"environment:{source.key}"
    return "checkpoint:" + hashlib.sha256(source.url.encode()).hexdigest()


class Volumes:
    """The node's published volumes. Thread-safe: one lock per target path, since the
    kubelet calls for different volumes at once."""

    def __init__(self, config: BootseerConfig, settings: Settings):
        self.config, self.settings = config, settings
        self.records = Path(settings.state_dir) / "volumes"
        self.records.mkdir(parents=True, exist_ok=True)
        os.chmod(settings.state_dir, 0o700)    # names of the node's pods and volumes
        self._handles: dict[str, MountHandle] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._store: Backend | None = None

    # -- records ------------------------------------------------------------------------------
    def _record_path(self, target: str) -> Path:
        return self.records / (hashlib.sha256(target.encode()).hexdigest()[:32] + ".json")

    def record(self, target: str) -> dict | None:
        try:
            rec = json.loads(self._record_path(target).read_text())
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) and rec.get("target_path") == target else None

    def _lock(self, target: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(target, threading.Lock())

    def store(self) -> Backend:
        if self._store is None:
            self._store = open_store(self.config.store.url, self.config)
        return self._store

    # -- publish ------------------------------------------------------------------------------
    def publish(self, volume: Volume) -> str:
        """Publish ``volume`` at its target path; returns ``published`` or ``already``
        (the same volume is there and live)."""
        target = volume.target_path
        with self._lock(target):
            rec = self.record(target)
            fingerprint = _fingerprint(volume.source)
            if rec is not None:
                if rec.get("volume_id") != volume.volume_id or rec.get("source") != fingerprint:
                    raise VolumeConflict(f"{target} already holds volume {rec.get('volume_id')} "
                                         f"({str(rec.get('source'))[:30]}), not "
                                         f"{volume.volume_id}")
                if self._live(rec):
                    return "already"
                log.info("%s: the volume recorded there is gone: publishing it again", target)
                self._teardown(rec)
            elif mounts.is_mount_point(target):
                raise VolumeConflict(f"{target} is a mount point bootseer did not make")
            rec = {"volume_id": volume.volume_id, "target_path": target,
                   "source": fingerprint, "kind": type(volume.source).__name__,
                   "pod": volume.pod, "created": time.time(), "form": None}
            write_json(self._record_path(target), rec)   # first: an unpublish then finds it
            try:
                os.makedirs(target, exist_ok=True)
                if isinstance(volume.source, EnvironmentVolume):
                    rec["form"] = self._publish_environment(volume.source, target)
                else:
                    rec["form"] = self._publish_checkpoint(volume.source, target)
            except BaseException:
                self._teardown(rec)
                raise
            write_json(self._record_path(target), rec)
            log.info("published %s for %s at %s (%s)", volume.source.describe(),
                     volume.pod or volume.volume_id, target, rec["form"])
            return "published"

    def _publish_environment(self, source: EnvironmentVolume, target: str) -> str:
        store = self.store()
        manifest = self.wait_published(source.key)
        check_driver(manifest)
        # the pod mounts the volume at the environment's prefix: restored as made there
        restore(store, {**manifest, "prefix": target}, target, self.config, source.key, None,
                as_mount=True, writable=False)
        return "mount" if mounted_info(target) is not None else "directory"

    def wait_published(self, key: str) -> dict:
        """The manifest published under ``key``, waiting while its builder holds the
        lease (up to ``build_wait_s``)."""
        store = self.store()
        deadline = time.monotonic() + self.settings.build_wait_s
        while True:
            digest = store.get_ref(env_ref(key))
            if digest is not None:
                return load_manifest(store, digest, key)
            holder = self._builder(key)
            if holder is None:
                raise EnvironmentNotFound(
                    f"no environment {key[:19]} in the store, and nobody builds it; hint: "
                    f"bootseer deps ensure SPEC --prefix PATH --store URL publishes it")
            if time.monotonic() >= deadline:
                raise EnvironmentBuilding(f"environment {key[:19]} is being built by "
                                          f"{holder}: the kubelet retries the mount")
            time.sleep(_POLL_S)

    def _builder(self, key: str) -> str | None:
        """Who holds ``key``'s build lease, if its lease is live."""
        store = self.store()
        digest = store.get_ref(lease_ref(key))
        if digest is None:
            return None
        try:
            info = json.loads(store.read(digest))
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict) or float(info.get("expires", 0)) < time.time():
            return None    # its builder died: nobody will publish
        return str(info.get("owner", "another node"))

    def _publish_checkpoint(self, source: CheckpointVolume, target: str) -> str:
        handle = mount_checkpoint(source.url, target, self.config)
        self._handles[target] = handle
        return handle.backend

    def _live(self, rec: dict) -> bool:
        target = rec["target_path"]
        if rec.get("kind") == CheckpointVolume.__name__:
            handle = self._handles.get(target)
            return handle is not None and handle.proc.is_alive() and \
                mounts.is_mount_point(target)
        key = rec["source"].removeprefix("environment:")
        if rec.get("form") == "mount":
            info = mounted_info(target)
            return info is not None and info.get("key") == key
        marker = marker_of(target)
        return marker is not None and marker.get("key") == key

    # -- unpublish ----------------------------------------------------------------------------
    def unpublish(self, volume_id: str, target_path: str) -> bool:
        """Undo the volume at ``target_path`` and remove the path; False when nothing was
        published there (the spec's answer is then OK all the same)."""
        check_target(target_path, self.settings.kubelet_dir)
        with self._lock(target_path):
            rec = self.record(target_path)
            if rec is None:
                if mounts.is_mount_point(target_path):
                    raise VolumeConflict(f"{target_path} is a mount point bootseer did not "
                                         f"make: not unmounting it")
                _remove_dir(target_path)
                return False
            if rec.get("volume_id") != volume_id:
                log.warning("%s: unpublishing volume %s recorded there (asked: %s)",
                            target_path, rec.get("volume_id"), volume_id)
            self._teardown(rec)
            log.info("unpublished volume %s at %s", rec.get("volume_id"), target_path)
            return True

    def _teardown(self, rec: dict) -> None:
        """Undo what ``rec`` records at its target path (lazily where files are open),
        remove the path, then the record."""
        target = rec["target_path"]
        handle = self._handles.pop(target, None)
        if handle is not None:
            handle.unmount()
        elif rec.get("kind") == EnvironmentVolume.__name__:
            if os.path.exists(sidecar(target)) or mounts.is_mount_point(target):
                unmount_env(target)
            elif marker_of(target) is not None:
                rmtree(target)
        elif mounts.is_mount_point(target):   # a checkpoint whose server died with us
            mounts.lazy_unmount(target)
        _remove_dir(target)
        self._record_path(target).unlink(missing_ok=True)

    def close(self) -> None:
        """Stop serving the checkpoint volumes (their servers are this process's
        children); their records stay, for the kubelet's unpublish to clean up after.
        Environments stay mounted: the kernel serves them."""
        for target in list(self._handles):
            with self._lock(target):
                handle = self._handles.pop(target, None)
                if handle is not None:
                    handle.unmount()


def _remove_dir(path: str) -> None:
    """The target directory, if empty (what the plugin made there; never a file of
    someone's)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove %s: %s", path, e)
