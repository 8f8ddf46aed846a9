"""A converted image mounted lazily: its reference resolved to a tree, then the tree
session (``bootseer.tree.session``: demand reads, recording, hot-block prefetch)."""

from __future__ import annotations

from bootseer.config import BootseerConfig


def mount_image(config: BootseerConfig, ref: str, mountpoint: str, state_dir: str, *,
                record: bool = True, prefetch: bool = True, profile_digest: str | None = None,
                window_timeout_s: float = 600.0):
    """Resolve ``ref`` (errors surface here, before mounting) and serve its tree at
    ``mountpoint``. Returns (MountHandle, tree digest, profile or None, the tree's meta)."""
    from bootseer.image import convert
    from bootseer.store import open_store
    from bootseer.tree.session import mount_tree
    tree = convert.resolve(ref, open_store(config.store.url, config),
                          config.mount.platform or None)   # this node's tree of the image
    handle, profile, meta = mount_tree(config, tree, mountpoint, state_dir, record=record,
                                       prefetch=prefetch, profile_digest=profile_digest,
                                       window_timeout_s=window_timeout_s,
                                       name="bootseer-image")
    return handle, tree, profile, meta


def oci_config(meta: dict) -> dict:
    """The converted image's own settings, from the tree's meta (``mount_image`` returns
    it): ``env`` (``["K=V", ...]``), ``workdir``, ``entrypoint``, ``cmd``."""
    return {k: meta.get(k) for k in ("env", "workdir", "entrypoint", "cmd")}
