"""The store layout on any fsspec filesystem: ``s3://``, ``hdfs://``, ``webhdfs://``,
``gs://``, ``memory://``... Writes go to a temporary name and are then moved (atomic
where the filesystem is; S3 copies). HDFS has no package on test machines: it is reached
only through fsspec (``pyarrow`` for ``hdfs://``, plain HTTP for ``webhdfs://``) and tested
at the fsspec boundary with the ``memory://`` filesystem."""

from __future__ import annotations

import hashlib
import uuid
from typing import Iterator

from bootseer.errors import BlobNotFound, DigestMismatch, FetchError, RangeError, StoreError
from bootseer.store.digest import Digest, hex_of, parse


class FsspecBackend:
    writable = True

    def __init__(self, url: str, **storage_options):
        import fsspec
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except (ImportError, ValueError) as e:
            raise StoreError(f"cannot open store {url}: {e} (is the fsspec driver for this "
                             f"scheme installed? e.g. pip install 'bootseer[s3]')", url=url) from e
        self.root = root.rstrip("/")
        self.url = url.split("@")[-1] if "@" in url.split("://", 1)[-1].split("/")[0] else url
        self.host = url.split("://", 1)[-1].split("/")[0] or url.split("://")[0]

    def _blob(self, digest: Digest) -> str:
        h = hex_of(digest)
        return f"{self.root}/blobs/sha256/{h[:2]}/{h}"

    def _ref(self, name: str) -> str:
        from bootseer.store.backends.local import _check_ref_name
        return f"{self.root}/refs/{_check_ref_name(name)}"

    def stat(self, digest: Digest) -> int:
        try:
            return int(self.fs.size(self._blob(digest)))
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} not found in {self.url}", digest=digest,
                               url=self.url) from None

    def exists(self, digest: Digest) -> bool:
        return bool(self.fs.exists(self._blob(digest)))

    def read(self, digest: Digest, start: int = 0, end: int | None = None) -> bytes:
        size = self.stat(digest)
        if start > size:
            raise RangeError(f"range {start}-{end} outside blob {digest} of {size} bytes",
                             digest=digest, url=self.url, offset=start)
        end = size if end is None else min(end, size)
        try:
            return bytes(self.fs.cat_file(self._blob(digest), start=start, end=end))
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} not found in {self.url}", digest=digest,
                               url=self.url) from None
        except OSError as e:
            raise FetchError(f"reading {digest} from {self.url}: {e}", digest=digest,
                             url=self.url) from e

    def write(self, digest: Digest, data, size: int | None = None) -> bool:
        parse(digest)
        if self.exists(digest):
            return False
        if not isinstance(data, (bytes, bytearray, memoryview)):
            data = data.read()
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise DigestMismatch(f"refusing to store {digest}: the bytes hash to {actual}",
                                 digest=digest, url=self.url)
        final = self._blob(digest)
        tmp = f"{final}.tmp-{uuid.uuid4().hex}"
        self.fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(tmp, bytes(data))
        self.fs.mv(tmp, final)
        return True

    def list(self) -> Iterator[Digest]:
        try:
            paths = self.fs.find(f"{self.root}/blobs/sha256")
        except FileNotFoundError:
            return
        for p in paths:
            name = p.rsplit("/", 1)[-1]
            if len(name) == 64 and ".tmp-" not in name:
                yield "sha256:" + name

    def get_ref(self, name: str) -> Digest | None:
        try:
            return parse(self.fs.cat_file(self._ref(name)).decode().strip())
        except FileNotFoundError:
            return None

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
        for p in sorted(paths):
            name = p[len(base):] if p.startswith(base) else p.split("/refs/", 1)[-1]
            if name.startswith(prefix):
                yield name

    def close(self) -> None:
        pass
