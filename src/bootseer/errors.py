"""The whole exception tree of bootseer.

    BootseerError
    ├── ConfigError(ValueError)             a setting is invalid; names the field
    ├── StoreError(OSError)                 anything the store layer raises
    │   ├── BlobNotFound(FileNotFoundError) unknown digest (or ref)
    │   ├── DigestMismatch                  bytes do not hash to their digest
    │   ├── InvalidDigest(ValueError)       not "sha256:<64 hex>"
    │   ├── RangeError                      range outside the blob (HTTP 416)
    │   ├── WrongRange                      a 206 for another range than the one asked
    │   ├── FetchError                      the source failed after retries/deadline
    │   ├── ReadOnlyStore                   write to a read-only backend (http)
    │   └── CacheError                      node cache unusable (budget, disk full)
    ├── MountError(OSError)                 a tree or file cannot be served (mount(2), FUSE)
    └── TraceError                          a trace location cannot be read/written

Leaves also inherit the builtins callers already catch (OSError, FileNotFoundError,
ValueError). Errors carry fields (digest, url, offset) and say what to check.
"""

from __future__ import annotations

from bootseer import redact   # errors are shown and logged: no URL credentials


class BootseerError(Exception):
    """Root of every error bootseer raises on purpose."""


class UsageError(BootseerError, ValueError):
    """Arguments that cannot work together (a mirror of a non-http checkpoint, a rank
    outside its world): said as an error line by the CLI, a ValueError to API callers."""


class ConfigError(BootseerError, ValueError):
    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"invalid setting {field}: {message}")


class StoreError(BootseerError, OSError):
    def __init__(self, message: str, *, digest: str | None = None, url: str | None = None,
                 offset: int | None = None):
        self.digest = digest
        self.url = redact.url(url) if url else url
        self.offset = offset
        super().__init__(redact.text(message))

    def __str__(self) -> str:  # OSError's default __str__ hides the message when args differ
        return self.args[0] if self.args else ""


class BlobNotFound(StoreError, FileNotFoundError):
    pass


class DigestMismatch(StoreError):
    pass


class InvalidDigest(StoreError, ValueError):
    pass


class RangeError(StoreError):
    pass


class WrongRange(StoreError):
    """A server answered a range request with another range: its body is refused (not
    retried: the same server or proxy would answer the same)."""


class FetchError(StoreError):
    pass


class ReadOnlyStore(StoreError):
    pass


class CacheError(StoreError):
    pass


class TraceError(BootseerError, OSError):
    pass


class MountError(BootseerError, OSError):
    """A tree or file cannot be served: mount(2), a FUSE server, the kernel's EROFS."""
