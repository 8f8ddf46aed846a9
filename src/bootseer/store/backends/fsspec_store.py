"""The store layout on any fsspec filesystem: ``s3://``, ``gs://``, ``hdfs://``,
``webhdfs://``, ``memory://`` (and ``file://`` when forced with ``fsspec+file://``).

The filesystem comes from ``fsspec.core.url_to_fs``; range reads are
``fs.cat_file(path, start, end)``. Writes stream into a temporary name next to the blob
while hashing, and are moved into place with ``fs.mv`` only when the digest matches (on
object stores the move is a copy: a reader never sees a partial blob under the final name).

HDFS has no package on Debian test machines: it is reached only through fsspec
(``hdfs://`` via pyarrow's ``HadoopFileSystem``, ``webhdfs://`` via plain HTTP) and is
tested at the fsspec boundary: ``memory://`` and a small ``AbstractFileSystem`` registered
under the ``hdfs`` protocol in the tests, so ``hdfs://`` URLs go through this code.

Create-if-absent refs are check-then-write here (object stores have no atomic create).
"""

from __future__ import annotations

import hashlib
import io
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import BinaryIO

from bootseer.errors import BlobNotFound, DigestMismatch, FetchError, RangeError, StoreError
from bootseer.store.backends import check_ref_name
from bootseer.store.digest import Digest, hex_of, parse

_STREAM_CHUNK = 8 * 1024**2


class FsspecBackend:
    writable = True

    def __init__(self, url: str, **storage_options: object):
        """``url``: an fsspec URL of the store root; ``storage_options`` go to fsspec."""
        import fsspec
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")
        u = urllib.parse.urlsplit(url)
        netloc = (u.hostname or "") + (f":{u.port}" if u.port else "")
        self.url = urllib.parse.urlunsplit((u.scheme, netloc, u.path, "", ""))
        self.host = netloc or u.scheme

    def __repr__(self) -> str:
        return f"FsspecBackend({self.url!r})"

    def _blob(self, digest: Digest) -> str:
        h = hex_of(digest)
        return f"{self.root}/blobs/sha256/{h[:2]}/{h}"

    def _ref(self, name: str) -> str:
        return f"{self.root}/refs/{check_ref_name(name, url=self.url)}"

    def _not_found(self, digest: Digest) -> BlobNotFound:
        return BlobNotFound(f"blob {digest} not found in {self.url}", digest=digest, url=self.url)

    def stat(self, digest: Digest) -> int:
        path = self._blob(digest)
        try:
            return int(self.fs.size(path))
        except FileNotFoundError:
            raise self._not_found(digest) from None
        except OSError as e:
            raise FetchError(f"stat of {digest} in {self.url}: {e}", digest=digest,
                             url=self.url) from e

    def exists(self, digest: Digest) -> bool:
        return bool(self.fs.exists(self._blob(digest)))

    def read(self, digest: Digest, start: int = 0, end: int | None = None) -> bytes:
        size = self.stat(digest)
        if start > size or (start == size and size > 0 and end != start):
            raise RangeError(f"range [{start}, {end}) is outside blob {digest} of {size} bytes "
                             f"in {self.url}", digest=digest, url=self.url, offset=start)
        end = size if end is None else min(end, size)
        if end <= start:
            return b""
        try:
            return bytes(self.fs.cat_file(self._blob(digest), start=start, end=end))
        except FileNotFoundError:
            raise self._not_found(digest) from None
        except OSError as e:
            raise FetchError(f"reading {digest} [{start}, {end}) from {self.url}: {e}",
                             digest=digest, url=self.url, offset=start) from e

    def read_into(self, digest: Digest, start: int, buf: memoryview | bytearray) -> int:
        """Fill ``buf`` with the blob's bytes from ``start`` (fsspec returns bytes: one copy)."""
        view = memoryview(buf).cast("B")
        data = self.read(digest, start, start + len(view))
        if len(data) < len(view):
            raise RangeError(f"range [{start}, {start + len(view)}) outside blob {digest} in "
                             f"{self.url}", digest=digest, url=self.url, offset=start)
        view[:] = data
        return len(view)

    def write(self, digest: Digest, data: bytes | BinaryIO, size: int | None = None) -> bool:
        """Stream ``data`` to a temp name while hashing; move into place if it matches."""
        parse(digest)
        if self.exists(digest):
            return False
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = io.BytesIO(data)
        final = self._blob(digest)
        tmp = f"{final.rsplit('/', 1)[0]}/.tmp-{uuid.uuid4().hex}"
        h = hashlib.sha256()
        n = 0
        try:
            self.fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
            with self.fs.open(tmp, "wb") as out:
                while chunk := data.read(_STREAM_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    n += len(chunk)
            actual = "sha256:" + h.hexdigest()
            if actual != digest or (size is not None and n != size):
                raise DigestMismatch(f"refusing to store {digest} in {self.url}: the {n} bytes "
                                     f"hash to {actual}", digest=digest, url=self.url)
            self.fs.mv(tmp, final)
        except BaseException as e:
            try:
                if self.fs.exists(tmp):
                    self.fs.rm_file(tmp)
            except OSError:
                pass
            if isinstance(e, OSError) and not isinstance(e, StoreError):
                raise StoreError(f"cannot write blob {digest} to {self.url}: {e}",
                                 digest=digest, url=self.url) from e
            raise
        return True

    def list(self) -> Iterator[Digest]:
        try:
            paths = self.fs.find(f"{self.root}/blobs/sha256")
        except FileNotFoundError:
            return
        for p in paths:
            name = p.rsplit("/", 1)[-1]
            if len(name) == 64 and not name.startswith("."):
                yield "sha256:" + name

    def get_ref(self, name: str) -> Digest | None:
        try:
            text = self.fs.cat_file(self._ref(name)).decode(errors="replace").strip()
        except FileNotFoundError:
            return None
        return parse(text)

    def set_ref(self, name: str, digest: Digest, *, exclusive: bool = False) -> bool:
        parse(digest)
        path = self._ref(name)
        if exclusive and self.fs.exists(path):
            return False  # check-then-write: not atomic on object stores (documented)
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(path, (digest + "\n").encode())
        return True

    def delete_ref(self, name: str) -> None:
        try:
            self.fs.rm_file(self._ref(name))
        except FileNotFoundError:
            pass

    def list_refs(self, prefix: str = "") -> Iterator[str]:
        base = f"{self.root}/refs/"
        try:
            paths = self.fs.find(base)
        except FileNotFoundError:
            return
        names = []
        for p in paths:
            name = p.split("/refs/", 1)[-1] if not p.startswith(base) else p[len(base):]
            if name.startswith(prefix) and not name.rsplit("/", 1)[-1].startswith("."):
                names.append(name)
        yield from sorted(names)

    def close(self) -> None:
        pass
