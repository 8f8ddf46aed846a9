"""A writable overlay over a read-only mount: the lower layer stays as it is, writes go to
the upper directory (a restored environment's ``pip install``, its ``__pycache__``)."""

from __future__ import annotations

import os

from bootseer.errors import MountError
from bootseer.node import mounts


class OverlayError(MountError):
    pass


def mount_overlay(target: str, lower: str, upper: str, work: str, *,
                  name: str = "bootseer-env") -> None:
    """Mount an overlay at ``target`` (nosuid, nodev). The paths cannot hold a ',' or
    ':' (the options cannot quote them): the caller checks."""
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    try:
        mounts.mount(name, target, "overlay", mounts.MS_NOSUID | mounts.MS_NODEV, opts)
    except MountError as e:
        raise OverlayError(f"cannot mount the overlay at {target}: "
                           f"{os.strerror(e.errno or 0)}") from None
