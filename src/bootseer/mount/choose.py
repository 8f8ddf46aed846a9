"""The one chooser of how a tree or file set is served, and the one place a fallback is
said (once per process and kind of mount).

What is served, and the answers:

* a lazy tree (an image's rootfs, a lazily mounted environment): the kernel's EROFS, on
  the tree's blob when it is or can be made local on the node, else on a FUSE-served
  blob; where the kernel cannot, the FUSE tree view;
* a restored environment (its whole blob local): EROFS on the blob, or nothing (the
  caller extracts a copy);
* a file set (a remote checkpoint directory): devfuse with the kernel's passthrough for
  staged files, or mfusepy.

``mount.backend`` (``auto``/``erofs``/``fuse``) and ``ckpt.fuse``
(``auto``/``devfuse``/``mfusepy``) steer it: ``auto`` takes what this kernel and process
can do (each probed once per process) and says the fallback once; a forced backend that
cannot work here is an error, never a silent fallback."""

from __future__ import annotations

import logging

from bootseer.config import BootseerConfig
from bootseer.errors import MountError
from bootseer.mount.devfuse import probe
from bootseer.mount.erofs import kernel
from bootseer.mount.kinds import Serving, What

log = logging.getLogger("bootseer.mount")



_said: set[What] = set()
_FALLBACK = {
    What.TREE: "kernel EROFS path unavailable (%s): lazy trees use the FUSE tree view",
    What.ENV: "environments are restored by extraction, not mounted: %s",
    What.FILES: "FUSE passthrough unavailable (%s): checkpoint mounts use mfusepy",
}


def _fall_back(what: What, why: str) -> None:
    if what not in _said:
        _said.add(what)
        log.warning(_FALLBACK[what], why)


def choose(config: BootseerConfig, what: What) -> Serving | None:
    """How ``what`` is served here. For a tree, ``EROFS_FUSE_BLOB`` stands for the kernel
    path: it becomes ``EROFS_LOCAL`` where the mount finds the blob local
    (:func:`bootseer.mount.serve.serve_tree`). None: an environment is not mounted (the
    caller extracts it)."""
    if what is What.FILES:
        return _files(config.ckpt.fuse)
    wanted = config.mount.backend
    if wanted == "fuse":
        if what is What.TREE:
            return Serving.FUSE_VIEW
        _fall_back(what, "BOOTSEER_MOUNT_BACKEND=fuse")
        return None
    why = kernel.availability()
    if why is None:
        return Serving.EROFS_FUSE_BLOB if what is What.TREE else Serving.EROFS_LOCAL
    if wanted == "erofs":
        instead = ("fuse to use the FUSE tree view" if what is What.TREE else
                   "auto to restore environments by extraction")
        raise kernel.ErofsMountError(f"BOOTSEER_MOUNT_BACKEND=erofs but {why} (set it to "
                                     f"{'auto or ' if what is What.TREE else ''}{instead})")
    _fall_back(what, why)
    return Serving.FUSE_VIEW if what is What.TREE else None


def _files(wanted: str) -> Serving:
    if wanted == "mfusepy":
        return Serving.MFUSEPY
    why = probe.passthrough_unavailable()
    if why is None:
        return Serving.DEVFUSE
    if wanted == "devfuse":
        raise MountError(f"BOOTSEER_CKPT_FUSE=devfuse but FUSE passthrough is unavailable: "
                         f"{why} (set it to auto or mfusepy)")
    _fall_back(What.FILES, why)
    return Serving.MFUSEPY
