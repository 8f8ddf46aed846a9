"""How the CLI says that a command failed: ``bootseer: error: ...`` (one line; a tool's
own multi-line message indented under it), then ``bootseer: hint: ...`` where there is a
next step. Exit 2 for input that cannot work (usage), 1 for a failure. Never a traceback
(``-vv`` adds one for errors bootseer did not expect)."""

from __future__ import annotations

import errno
import sys
import traceback
from contextlib import contextmanager
from typing import TypeVar

from bootseer import redact
from bootseer.errors import BootseerError, StoreError

USAGE = 2
FAILURE = 1

# module that fsspec (or bootseer) imports for a URL scheme -> how to get it
_EXTRAS = {
    "s3fs": "pip install 'bootseer[s3]'",
    "gcsfs": "pip install 'bootseer[gcs]'",
    "pyarrow": "pip install 'bootseer[hdfs]' (hdfs:// goes through pyarrow's libhdfs)",
    "requests": "pip install 'bootseer[webhdfs]'",
    "adlfs": "pip install adlfs",
    "torch": "pip install torch",
    "grpc": "pip install 'bootseer[containerd]'",
}
# what fsspec says in its ImportError for a missing driver -> the module
_FSSPEC_SAYS = {"s3fs": "s3fs", "gcsfs": "gcsfs", "Google Storage": "gcsfs", "adlfs": "adlfs",
                "pyarrow": "pyarrow", "requests": "requests"}


_E = TypeVar("_E", bound=BootseerError)


def with_hint(error: _E, hint: str | None) -> _E:
    """``error`` carrying ``hint``, the next step shown under its line."""
    if hint:
        error.hint = hint
    return error


def missing_module(e: ImportError) -> str | None:
    name = (e.name or "").split(".")[0]
    if name not in _EXTRAS:
        name = next((m for said, m in _FSSPEC_SAYS.items() if said in str(e)), name)
    return name or None


def import_error(e: ImportError, what: str) -> BootseerError:
    module = missing_module(e)
    return with_hint(BootseerError(f"{what} needs the Python package {module or str(e)!s}, "
                                   f"which is not installed"),
                     _EXTRAS.get(module or "", f"pip install {module}" if module else None))


def os_error_text(e: OSError) -> str:
    """``[Errno 36] File name too long: 'x' -> 'y'`` as ``File name too long: x``."""
    if isinstance(e, BootseerError) or not e.strerror:
        return str(e) or type(e).__name__
    where = f": {e.filename}" if e.filename else ""
    return f"{e.strerror}{where}"


def os_error_hint(e: OSError) -> str | None:
    if e.errno is None:
        return None
    return {errno.ENOSPC: "free space on that file system (or point the path elsewhere)",
            errno.EDQUOT: "the disk quota is used up: free space or raise the quota",
            errno.ENAMETOOLONG: "use a shorter name (at most 255 bytes per path part)",
            errno.EACCES: "check the permissions (or run as a user who may write there)",
            errno.EROFS: "that file system is mounted read-only"}.get(e.errno)


@contextmanager
def reaching(url: str, what: str = "store"):
    """Turn what a remote location raises that is not bootseer's own error (a missing
    fsspec driver, an unknown host, a refused connection) into one line naming it."""
    try:
        yield
    except BootseerError:
        raise
    except ImportError as e:
        raise import_error(e, f"the {what} {redact.url(url)}") from None
    except OSError as e:
        raise with_hint(StoreError(f"cannot use the {what} {redact.url(url)}: "
                                   f"{os_error_text(e)}", url=url),
                        os_error_hint(e)) from None


def exit_code(e: BaseException) -> int:
    """2 for input that cannot work (bootseer's ValueErrors: a bad flag, setting, digest,
    profile), 1 for a failure."""
    return USAGE if isinstance(e, BootseerError) and isinstance(e, ValueError) else FAILURE


FUSE_HINT = ("a FUSE mount needs /dev/fuse and CAP_SYS_ADMIN (or the fusermount3 helper): "
             "'bootseer doctor' checks both")


def _is_fuse_unavailable(e: BaseException) -> bool:
    """A mount that failed for want of FUSE (not a mount point that is a file)."""
    fuse = sys.modules.get("bootseer.mount.fuse")   # never imported: not a mount error
    return (fuse is not None and isinstance(e, fuse.MountError)
            and any(s in str(e) for s in ("/dev/fuse", "did not mount")))


def report(e: BaseException, verbose: int = 0) -> int:
    """Say ``e`` on stderr as the CLI does; return the exit status."""
    hint = getattr(e, "hint", None) or (FUSE_HINT if _is_fuse_unavailable(e) else None)
    if isinstance(e, BootseerError):
        text = str(e)
    elif isinstance(e, ImportError) and missing_module(e) not in (None, "bootseer"):
        err = import_error(e, "this command")
        text, hint = str(err), err.hint
    elif isinstance(e, OSError):
        text, hint = os_error_text(e), hint or os_error_hint(e)
    else:   # a bug: one line, and the traceback only when asked for
        text = f"unexpected {type(e).__name__}: {e}"
        hint = hint or "this is a bug in bootseer: rerun with -vv for the traceback and report it"
        if verbose >= 2:
            traceback.print_exception(e, file=sys.stderr)
    say(text, hint)
    return exit_code(e)


def say(text: str, hint: str | None = None) -> None:
    lines = redact.text(text).strip().splitlines() or ["(no message)"]
    print(f"bootseer: error: {lines[0]}", file=sys.stderr)
    for line in lines[1:]:   # a tool's own multi-line message (uv's), kept as it wrote it
        print(f"  {line}", file=sys.stderr)
    if hint:
        print(f"bootseer: hint: {redact.text(hint)}", file=sys.stderr)


def warn_unknown_variables() -> None:
    from bootseer.config import unknown_variables
    for name, closest in unknown_variables():
        print(f"bootseer: warning: {name} is not a bootseer setting and is ignored"
              + (f" (did you mean {closest}?)" if closest else
                 " (the settings are listed in docs/configuration.md)"), file=sys.stderr)
