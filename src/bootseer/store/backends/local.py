"""A store in a local directory: the embedded default (no server).

Layout (also served read-only over HTTP by nginx, see ``http.py``)::

    <root>/blobs/sha256/<hex[:2]>/<hex>
    <root>/refs/<name>            a text file holding one digest

Writes go to a temp file in the same directory, are verified, fsynced and renamed, so a
killed writer never leaves a partial blob visible. Exclusive refs use O_EXCL (atomic).

The layout is world-readable whatever the writer's umask (blobs 0444, refs 0644, folders
0755), so any web server (nginx workers run as an ordinary user) can serve it as is.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from bootseer.errors import BlobNotFound, DigestMismatch, RangeError, ReadOnlyStore, StoreError
from bootseer.store.backends import check_ref_name
from bootseer.store.digest import Digest, hex_of, parse

BLOB_MODE, REF_MODE, DIR_MODE = 0o444, 0o644, 0o755


def _makedirs(path: Path) -> None:
    """``mkdir -p`` giving every folder it creates DIR_MODE (mkdir alone obeys the umask)."""
    if path.is_dir():
        return
    _makedirs(path.parent)
    try:
        path.mkdir()
    except FileExistsError:
        if not path.is_dir():
            raise
        return
    os.chmod(path, DIR_MODE)


def _check_ref_name(name: str) -> str:  # older name, kept for callers
    return check_ref_name(name)


_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


class LocalBackend:
    host = "local"

    def __init__(self, root: str | os.PathLike[str]):
        """Open (creating if needed) the store in directory ``root``. A store this process
        cannot write (a read-only mount, a mirror) opens too, with ``writable`` False:
        reads work, writes raise ReadOnlyStore."""
        self.root = Path(os.path.abspath(root))   # the same store after a chdir
        self.url = str(self.root)
        try:
            _makedirs(self.root / "blobs" / "sha256")
            _makedirs(self.root / "refs")
        except OSError as e:
            if not (e.errno in _READ_ONLY_ERRNOS and self.root.is_dir()):
                raise StoreError(f"cannot create store at {self.root}: {e}", url=self.url) from e
            # a read-only store lacking a folder: nothing to read there, nothing to write
        # access() answers for this process (root included) and for read-only mounts
        self.writable = all(os.access(self.root / d, os.W_OK) for d in ("blobs/sha256", "refs"))

    def _read_only(self, what: str, cause: OSError | None = None) -> ReadOnlyStore:
        why = f" ({cause.strerror})" if cause is not None and cause.strerror else ""
        return ReadOnlyStore(f"cannot {what}: store {self.url} is read-only{why}", url=self.url)

    def path(self, digest: Digest) -> Path:
        h = hex_of(digest)
        return self.root / "blobs" / "sha256" / h[:2] / h

    def stat(self, digest: Digest) -> int:
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} not found in {self.url}", digest=digest,
                               url=self.url) from None

    def exists(self, digest: Digest) -> bool:
        return self.path(digest).exists()

    def read(self, digest: Digest, start: int = 0, end: int | None = None) -> bytes:
        try:
            with open(self.path(digest), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if start > size or (start == size and size > 0 and end != start):
                    raise RangeError(f"range {start}-{end} outside blob {digest} of {size} bytes",
                                     digest=digest, url=self.url, offset=start)
                end = size if end is None else min(end, size)
                return os.pread(f.fileno(), end - start, start)
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} not found in {self.url}", digest=digest,
                               url=self.url) from None

    def read_into(self, digest: Digest, start: int, buf: memoryview | bytearray) -> int:
        """Fill ``buf`` (a writable buffer) with the blob's bytes from ``start``; RangeError
        if the blob has fewer."""
        view = memoryview(buf).cast("B")
        try:
            fd = os.open(self.path(digest), os.O_RDONLY)
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} not found in {self.url}", digest=digest,
                               url=self.url) from None
        try:
            got = 0
            while got < len(view):
                n = os.preadv(fd, [view[got:]], start + got)
                if n == 0:
                    raise RangeError(f"range [{start}, {start + len(view)}) outside blob "
                                     f"{digest} of {start + got} bytes", digest=digest,
                                     url=self.url, offset=start)
                got += n
            return got
        finally:
            os.close(fd)

    def write(self, digest: Digest, data: bytes | BinaryIO, size: int | None = None) -> bool:
        """Store ``data`` (bytes, or a binary file object streamed 1 MiB at a time) under
        ``digest``; hashed while written, fsynced, renamed into place only if it matches."""
        parse(digest)
        final = self.path(digest)
        if final.exists():
            return False
        if not self.writable:
            raise self._read_only(f"write blob {digest}")
        try:
            _makedirs(final.parent)
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".tmp-")
        except OSError as e:
            if e.errno in _READ_ONLY_ERRNOS:
                raise self._read_only(f"write blob {digest}", e) from e
            raise StoreError(f"cannot write blob {digest} to {self.url}: {e}", digest=digest,
                             url=self.url) from e
        try:
            h = hashlib.sha256()
            written = 0
            with os.fdopen(fd, "wb") as out:
                if isinstance(data, (bytes, bytearray, memoryview)):
                    h.update(data)
                    out.write(data)
                    written = len(data)
                else:
                    while chunk := data.read(1 << 20):
                        h.update(chunk)
                        out.write(chunk)
                        written += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            if size is not None and written != size:
                raise DigestMismatch(f"refusing to store {digest}: expected {size} bytes, got "
                                     f"{written}", digest=digest, url=self.url)
            if "sha256:" + h.hexdigest() != digest:
                raise DigestMismatch(f"refusing to store {digest}: the bytes hash to "
                                     f"sha256:{h.hexdigest()}", digest=digest, url=self.url)
            os.chmod(tmp, BLOB_MODE)
            os.replace(tmp, final)
            return True
        except OSError as e:
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"cannot write blob {digest} to {self.url}: {e}", digest=digest,
                             url=self.url) from e
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def list(self) -> Iterator[Digest]:
        for d in sorted((self.root / "blobs" / "sha256").glob("??")):
            for f in d.iterdir():
                if not f.name.startswith("."):
                    yield "sha256:" + f.name

    def _ref_path(self, name: str) -> Path:
        return self.root / "refs" / check_ref_name(name, url=self.url)

    def get_ref(self, name: str) -> Digest | None:
        path = self._ref_path(name)
        try:
            text = path.read_text().strip()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        try:
            return parse(text)
        except StoreError as e:
            raise StoreError(f"ref {name} in {self.url} is corrupt ({path} holds {text[:80]!r}, "
                             f"not a digest): set it again", url=self.url) from e

    def set_ref(self, name: str, digest: Digest, *, exclusive: bool = False) -> bool:
        """Atomic: the ref file is written to a temp name, fsynced, then renamed (or, with
        ``exclusive``, hard-linked: link() fails if the name exists, across processes)."""
        parse(digest)
        path = self._ref_path(name)
        if not self.writable:
            raise self._read_only(f"set ref {name}")
        try:
            _makedirs(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        except (FileExistsError, NotADirectoryError) as e:
            raise StoreError(f"cannot create ref {name} in {self.url}: a ref is named like one "
                             f"of its parent folders", url=self.url) from e
        except OSError as e:
            if e.errno in _READ_ONLY_ERRNOS:
                raise self._read_only(f"set ref {name}", e) from e
            raise StoreError(f"cannot set ref {name} in {self.url}: {e}", url=self.url) from e
        os.fchmod(fd, REF_MODE)   # mkstemp makes 0600: a web server could not serve it
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            if exclusive:
                try:
                    os.link(tmp, path)  # atomic create-if-absent with full contents
                except FileExistsError:
                    return False
                return True
            os.replace(tmp, path)
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def delete_ref(self, name: str) -> None:
        try:
            self._ref_path(name).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno in _READ_ONLY_ERRNOS:
                raise self._read_only(f"remove ref {name}", e) from e
            raise StoreError(f"cannot remove ref {name} from {self.url}: {e}",
                             url=self.url) from e

    def list_refs(self, prefix: str = "") -> Iterator[str]:
        base = self.root / "refs"
        for p in sorted(base.rglob("*")):
            if p.is_file() and not p.name.startswith("."):
                name = str(p.relative_to(base))
                if name.startswith(prefix):
                    yield name

    def close(self) -> None:
        pass
