"""The one binding of the C library, for the calls Python's ``os`` lacks: mount(2),
umount2(2), ioctl(2) with its return value, prctl(2), statfs(2), renameat2(2).

Loaded once, at import: a ``preexec_fn`` (``bootseer.node.proc``) runs between fork and
exec, where loading a library may deadlock on a lock another thread held. The argument
types are declared here, once, for every caller: ctypes keeps one function object per
name and library, so a second declaration elsewhere would silently change the first."""

from __future__ import annotations

import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                       ctypes.c_ulong]
libc.prctl.restype = ctypes.c_int

renameat2 = getattr(libc, "renameat2", None)
"""None where the C library predates it (glibc < 2.28)."""
if renameat2 is not None:
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]


def last_error(what: str) -> OSError:
    """The OSError for the call that just failed (its errno), saying ``what`` failed."""
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")
