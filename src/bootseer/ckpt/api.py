"""``bootseer.ckpt.open(url)``: a binary file object over the striped engine.

Usable by ``torch.load``, ``safetensors.torch.load`` (bytes), ``pickle`` and the DCP reader:
``read``, ``readinto``, ``seek``, ``tell``, ``readable``, ``seekable``.
"""

from __future__ import annotations

import io
import os
import threading

from bootseer.ckpt.source import open_source
from bootseer.ckpt.striped import Engine

_engine: Engine | None = None
_engine_pid = 0
_engine_lock = threading.Lock()


def default_engine() -> Engine:
    """The process-wide engine (one budget, one fetcher); rebuilt after a fork."""
    global _engine, _engine_pid
    with _engine_lock:
        if _engine is None or _engine_pid != os.getpid():
            from bootseer.config import BootseerConfig
            cfg = BootseerConfig.from_env()
            _engine, _engine_pid = Engine(cfg.ckpt, cfg.fetch), os.getpid()
        return _engine


class CkptFile(io.RawIOBase):
    def __init__(self, reader, name: str):
        super().__init__()
        self._r, self.name, self._pos = reader, name, 0

    @property
    def size(self) -> int:
        return self._r.size

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

    def read(self, size: int = -1) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if size is None or size < 0:
            size = max(0, self._r.size - self._pos)
        data = self._r.read(self._pos, size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        n = len(data)
        memoryview(b).cast("B")[:n] = data
        return n

    def close(self) -> None:
        if not self.closed:
            self._r.close()
        super().close()

    def stats(self) -> dict:
        r = self._r
        return {"size": r.size, "consumed": r.consumed, "first_byte_s": r.first_byte_s}


def open(url: str, mode: str = "rb", *, engine: Engine | None = None,  # noqa: A001
         stripes: str = "striped", source=None) -> CkptFile:
    """Open a remote checkpoint file (any fsspec URL, or a local path) for reading."""
    if mode != "rb":
        raise ValueError(f"bootseer.ckpt.open is read-only (mode {mode!r}); use 'rb'")
    engine = engine or default_engine()
    src = source or open_source(url)
    return CkptFile(engine.reader(src, stripes), url)
