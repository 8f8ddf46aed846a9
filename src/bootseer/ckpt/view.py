"""A remote checkpoint directory as a read-only TreeView for :mod:`bootseer.mount`: entries
from :class:`RemoteDir`, bytes from the engine (striped, or the single-stream baseline)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading

from bootseer import redact
from bootseer.ckpt import credentials
from bootseer.ckpt.engine import Engine
from bootseer.ckpt.listing import PathOutsideRoot, RemoteDir, clean
from bootseer.mount.view import Attr

log = logging.getLogger(__name__)
BLKSIZE = 128 << 10
"""``st_blksize`` of the mount's files: Python's ``open()`` buffers that much per read, and
DCP reads each small item (a bytes object, an optimizer step) through such a buffer: at
1 MiB, each of them pulled a mebibyte of a file the rank otherwise never reads."""


class RemoteDirView:
    """What ``bootseer ckpt mount`` shows. ``stats_path``: the load report (JSON) written at
    unmount."""

    def __init__(self, remote: RemoteDir, engine: Engine, *, mode: str = "striped",
                 stats_path: str | None = None, node_reads=None):
        self.remote, self.engine, self.mode = remote, engine, mode
        self.node_reads = node_reads   # ckpt.share.NodeReads: told each file's first read
        self.url = remote.url
        self.stats_path = stats_path
        self._readers: dict[str, object] = {}
        self._lock = threading.Lock()
        remote.check_root()  # fail at mount, not at first use, when the root is wrong

    def getattr(self, path: str) -> Attr:
        return dataclasses.replace(self.remote.attr(path), blksize=BLKSIZE)

    def readdir(self, path: str) -> list[str]:
        return self.remote.names(path)

    def readlink(self, path: str) -> str:
        raise OSError(22, "not a symlink", path)

    def reader(self, path: str):
        rel = clean(path)
        with self._lock:
            r = self._readers.get(rel)
        if r is None:
            r = self.engine.reader(self.remote.source(rel), self.mode)
            with self._lock:
                r = self._readers.setdefault(rel, r)
            if self.node_reads is not None:
                self.node_reads.read(rel)
        return r

    def release(self, path: str) -> None:
        if self.mode == "single":  # the baseline's buffer lives as long as the open file
            with self._lock:
                self._readers.pop(clean(path), None)

    def read(self, path: str, size: int, offset: int) -> bytes:
        return self.reader(path).read(offset, size)

    def backing_path(self, path: str) -> str | None:
        """The staged copy of ``path`` once every stripe of it is in place (else None):
        a devfuse mount opens it with passthrough, and the kernel serves its reads and
        mmaps (the load report counts the open, not those reads)."""
        if self.mode != "striped":
            return None
        reader = self.reader(path)   # taking the file up also spares it from gc
        staged = reader.staged
        # the marker: another process (a `ckpt prefetch`) may have finished it meanwhile
        if not (staged.complete or staged.marker.exists()):
            return None
        # the engine never sees passthrough reads: the access profile takes the open as a
        # read of the whole file, so the next resume still prefetches it in this order
        self.engine.recorder.add(reader.source.url, reader.source.key, 0, reader.size)
        self.engine.counters.passed_through(reader.size)   # and the load report the open
        return str(staged.path)

    def statfs(self) -> dict:
        return {"f_bsize": 1 << 20, "f_frsize": 1 << 20, "f_namemax": 255}

    def stats(self) -> dict:
        return {"url": redact.url(self.url), "mode": self.mode,
                **self.engine.statistics().as_dict()}

    def close(self) -> None:
        from bootseer.ckpt import profile
        try:  # the next resume prefetches what this one read
            profile.save(self.engine.staging.dir, self.url, self.engine.recorder,
                         store_url=self.engine.store_url,
                         private=self.engine.staging.private_for(credentials.carried(self.url)))
            if self.node_reads is not None:   # and this node stages what its ranks read
                self.node_reads.save(self.engine.recorder)
        except OSError as e:
            log.warning("access profile of %s not saved: %s", redact.url(self.url),
                        redact.text(str(e)))
        try:
            from bootseer.ckpt.stats import trace_load
            trace_load(self.engine.statistics(), self.engine.counters.started_wall,
                       url=self.url, mode=self.mode, via="mount")
        except Exception as e:  # noqa: BLE001 - the report never fails an unmount
            log.warning("checkpoint load report not traced: %s", e)
        if self.stats_path:
            tmp = f"{self.stats_path}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.stats(), f)
            os.replace(tmp, self.stats_path)
        self.engine.close()


__all__ = ["RemoteDirView", "PathOutsideRoot"]
