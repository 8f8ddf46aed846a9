"""``bootseer.ckpt.open(url)``: a binary file object over the striped engine.

Usable by ``torch.load``, ``safetensors.torch.load`` (bytes), ``pickle`` and the DCP reader:
``read``, ``readinto`` (straight into the caller's buffer from the staged copy),
``seek``, ``tell``, ``readable``, ``seekable``.
"""

from __future__ import annotations

import io
import os
import threading

from bootseer import redact
from bootseer.ckpt.engine import Engine
from bootseer.ckpt.replicas import check_same
from bootseer.ckpt.source import HttpFileSource, open_source
from bootseer.errors import BlobNotFound, BootseerError, FetchError, UsageError
from bootseer.store.replicas import Replicas

_engine: Engine | None = None
_engine_pid = 0
_engine_lock = threading.Lock()


def default_engine() -> Engine:
    """The process-wide engine (one budget, one fetcher, the node's staging directory);
    rebuilt after a fork."""
    global _engine, _engine_pid
    with _engine_lock:
        if _engine is None or _engine_pid != os.getpid():
            from bootseer.ckpt.staging import node_staging_dir
            from bootseer.config import BootseerConfig
            cfg = BootseerConfig.from_env()
            _engine = Engine(cfg.ckpt, cfg.fetch, staging=str(node_staging_dir(cfg)),
                             store_url=cfg.store.url)
            _engine_pid = os.getpid()
        return _engine


class CkptFile(io.RawIOBase):
    """One open remote file; its reader (and staged stripes) are shared with every other
    open of the same file version in the process."""

    def __init__(self, reader, name: str):
        super().__init__()
        self._r, self.name, self._pos = reader, name, 0
        self.consumed = 0

    @property
    def size(self) -> int:
        return self._r.size

    @property
    def reader(self):
        return self._r

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._r.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, b) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        n = self._r.readinto(self._pos, memoryview(b).cast("B"))
        self._pos += n
        self.consumed += n
        return n

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, self._r.size - self._pos)
        buf = bytearray(max(0, min(size, self._r.size - self._pos)))
        n = self.readinto(buf)
        return bytes(buf) if n == len(buf) else bytes(buf[:n])

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        if not self.closed:
            self._r.close()
        super().close()


def open(url: str, mode: str = "rb", *, engine: Engine | None = None,  # noqa: A001
         stripes: str = "striped", source=None, mirrors: list[str] | tuple[str, ...] = ()
         ) -> CkptFile:
    """Open a remote checkpoint file (any fsspec URL, or a local path) for reading.

    Args:
        url: the file; ``http(s)://``, ``s3://``, ``hdfs://``, ``file://`` or a path.
        mode: only ``"rb"``.
        engine: the engine to read through (default: the process-wide one).
        stripes: ``"striped"`` or ``"single"`` (the one-stream baseline).
        source: a range source already made for ``url`` (skips the HEAD request).
        mirrors: URLs of the same file on other http(s) servers: stripes go to each in
            turn, slow ones are hedged, failed ones fail over (store/replicas.py).
    Raises:
        BlobNotFound: no file at ``url``.
        ReplicaMismatch: a mirror's file differs in size or mtime.
    Credentials in ``url`` (``user:password@``, a presigned query) never appear in the
    file's ``name``, in errors or in logs (bootseer/redact.py).
    """
    if mode != "rb":
        raise ValueError(f"bootseer.ckpt.open is read-only (mode {mode!r}); use 'rb'")
    engine = engine or default_engine()
    try:
        src = source or open_source(url)
        if mirrors:
            src = replicas_of(src, mirrors)
    except BootseerError:
        raise   # its message and url are redacted already
    except Exception as e:   # a library's (fsspec, aiohttp) error may quote the whole URL
        shown = redact.text(str(e))
        if shown == str(e):
            raise
        kind = BlobNotFound if isinstance(e, FileNotFoundError) else FetchError
        raise kind(f"cannot open {redact.url(url)}: {shown}", url=url) from None
    return CkptFile(engine.reader(src, stripes), redact.url(url))


def replicas_of(source, mirrors) -> Replicas:
    """``source`` and the same file at each mirror URL (checked: size and mtime)."""
    if not isinstance(source, HttpFileSource):
        raise UsageError(f"mirrors are supported for http(s) files, not "
                         f"{redact.url(source.url)}")
    copies = [source]
    for url in mirrors:
        m = HttpFileSource.stat(url)
        check_same(source.url, source.size, source.mtime, m.url, m.size, m.mtime)
        copies.append(m)
    return Replicas(copies)
