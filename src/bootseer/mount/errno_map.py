"""The one place where exceptions become errno values for the kernel."""

from __future__ import annotations

import errno
import logging

from bootseer.errors import BlobNotFound, StoreError

log = logging.getLogger("bootseer.mount")


def to_errno(e: BaseException, path: str = "") -> int:
    if isinstance(e, (FileNotFoundError,)) and not isinstance(e, BlobNotFound):
        return errno.ENOENT
    if isinstance(e, NotADirectoryError):
        return errno.ENOTDIR
    if isinstance(e, IsADirectoryError):
        return errno.EISDIR
    if isinstance(e, PermissionError):
        return errno.EACCES
    if isinstance(e, StoreError):
        # missing blob, corrupt chunk, store down: the data exists but cannot be served
        log.error("EIO on %s: %s (digest %s, source %s)", path, e, getattr(e, "digest", None),
                  getattr(e, "url", None))
        return errno.EIO
    if isinstance(e, OSError) and e.errno:
        return e.errno
    log.exception("EIO on %s: unexpected %s", path, type(e).__name__)
    return errno.EIO
