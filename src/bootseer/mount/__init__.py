"""The one read-only FUSE adapter. Techniques provide a :class:`~bootseer.mount.view.TreeView`
(an image tree, an environment snapshot, a remote checkpoint directory); this package
turns it into a mount (ro, nosuid, nodev, 1 MiB kernel reads).

Lazy trees may instead be served by the kernel's EROFS (``bootseer.mount.erofs``);
:func:`tree_backend` is the one place that chooses."""

from __future__ import annotations

import logging

log = logging.getLogger("bootseer.mount")
_fallback_said = False


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
