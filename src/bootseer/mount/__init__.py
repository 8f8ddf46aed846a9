"""The one read-only FUSE adapter. Techniques provide a :class:`~bootseer.mount.view.TreeView`
(an image tree, an environment snapshot, a remote checkpoint directory); this package
turns it into a mount (ro, nosuid, nodev, 1 MiB kernel reads).

Lazy trees may instead be served by the kernel's EROFS (``bootseer.mount.erofs``);
:func:`tree_backend` is the one place that chooses. Checkpoint mounts may be served by
bootseer's own /dev/fuse server with passthrough (``bootseer.mount.devfuse``);
:func:`ckpt_backend` chooses."""

from __future__ import annotations

import logging

log = logging.getLogger("bootseer.mount")
_fallback_said = False
_ckpt_fallback_said = False


def tree_backend(config) -> str:
    """``"erofs"`` or ``"fuse"`` for a lazy tree mount, from ``mount.backend`` and what
    this kernel can do (checked once per process); a fallback from ``auto`` is logged
    once. A forced ``erofs`` the kernel cannot do is an error, not a silent fallback."""
    global _fallback_said
    wanted = config.mount.backend
    if wanted == "fuse":
        return "fuse"
    from bootseer.mount.erofs.kernel import ErofsMountError, availability
    why = availability()
    if why is None:
        return "erofs"
    if wanted == "erofs":
        raise ErofsMountError(f"BOOTSEER_MOUNT_BACKEND=erofs but {why} (set it to auto or "
                              "fuse to use the FUSE tree view)")
    if not _fallback_said:
        _fallback_said = True
        log.warning("kernel EROFS path unavailable (%s): lazy trees use the FUSE tree view",
                    why)
    return "fuse"


def ckpt_backend(wanted: str) -> str:
    """``"devfuse"`` or ``"mfusepy"`` for a checkpoint mount, from ``ckpt.fuse`` and a
    probe of this kernel and process (once per process); a fallback from ``auto`` is
    logged once, a forced ``devfuse`` that cannot work is an error."""
    global _ckpt_fallback_said
    if wanted == "mfusepy":
        return "mfusepy"
    from bootseer.mount.devfuse.probe import passthrough_unavailable
    from bootseer.mount.fuse import MountError
    why = passthrough_unavailable()
    if why is None:
        return "devfuse"
    if wanted == "devfuse":
        raise MountError(f"BOOTSEER_CKPT_FUSE=devfuse but FUSE passthrough is unavailable: "
                         f"{why} (set it to auto or mfusepy)")
    if not _ckpt_fallback_said:
        _ckpt_fallback_said = True
        log.warning("FUSE passthrough unavailable (%s): checkpoint mounts use mfusepy", why)
    return "mfusepy"
