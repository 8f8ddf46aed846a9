"""A ``torch.distributed.checkpoint`` StorageReader that reads through the striped engine.

``dcp.load(state, storage_reader=StripedDCPReader("http://host/ckpt/step100"))`` loads a
DCP checkpoint from any fsspec URL (or local path) with stripes in flight and one memory
budget, no mount needed. It is torch's own ``FileSystemReader`` (same planner, same file
slicing) with the file system swapped for :class:`EngineFS`.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bootseer.ckpt.api import CkptFile


def _fs_class():
    from torch.distributed.checkpoint.filesystem import FileSystemBase

    class EngineFS(FileSystemBase):
        """Read-only: paths are URL strings; streams are :class:`bootseer.ckpt.CkptFile`."""

        def __init__(self, engine=None, root: str = "", mirrors=()):
            self.engine, self.root, self.mirrors = engine, root, tuple(mirrors)
            self.pinned: dict[str, CkptFile] = {}  # files kept open across a read_data call

        def open_file(self, path):
            from bootseer.ckpt.api import open as ckpt_open
            path = str(path)
            rel = path[len(self.root):] if self.root and path.startswith(self.root) else None
            mirrors = [m.rstrip("/") + rel for m in self.mirrors] if rel else []
            return ckpt_open(path, engine=self.engine, mirrors=mirrors)

        @contextmanager
        def create_stream(self, path, mode):
            if "r" not in mode or "+" in mode or "w" in mode:
                raise PermissionError(f"{path}: the striped DCP reader is read-only")
            pinned = self.pinned.get(str(path))
            if pinned is not None:
                pinned.seek(0)
                yield pinned
                return
            f = self.open_file(path)
            try:
                yield f
            finally:
                f.close()

        def concat_path(self, path, suffix):
            return str(path).rstrip("/") + "/" + suffix

        def init_path(self, path):
            path = str(path)
            return path if "://" in path else os.path.abspath(path)

        def rename(self, path, new_path):
            raise PermissionError("the striped DCP reader is read-only")

        def mkdir(self, path):
            raise PermissionError("the striped DCP reader is read-only")

        def rm_file(self, path):
            raise PermissionError("the striped DCP reader is read-only")

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id) -> bool:
            return True

        def exists(self, path) -> bool:
            from bootseer.ckpt.source import open_source
            try:
                open_source(str(path))
                return True
            except FileNotFoundError:
                return False

    return EngineFS


# Named as the class it returns: the class derives from torch's, and torch is heavy, so it is
# made on the first call rather than at import.
def StripedDCPReader(path: str, engine=None, mirrors=()):
    """A ``FileSystemReader`` over the engine; ``path`` is the checkpoint directory URL,
    ``mirrors`` the URLs of exact copies of that directory (hedged reads)."""
    from torch.distributed.checkpoint import FileSystemReader

    class _Reader(FileSystemReader):
        def __init__(self, path, engine=None):
            super().__init__(os.devnull)  # torch's local FileSystem is replaced just below
            # one EngineFS, as torch's ``fs`` (typed as torch's FileSystem) and as ours
            self.fs = self.efs = _fs_class()(engine, str(path).rstrip("/"), mirrors)
            self.path = self.fs.init_path(path)

        def read_data(self, plan, planner):
            """Before torch reads item by item, stream every range of the plan (plan
            prefetch from the DCP metadata, within the budget), then read as torch does."""
            from bootseer.ckpt.api import default_engine
            from bootseer.ckpt.prefetch import Prefetch, Span
            ranges: dict[str, list[tuple[int, int]]] = {}
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                ranges.setdefault(info.relative_path, []).append(
                    (info.offset, info.offset + info.length))
            prefetch = None
            engine = self.efs.engine or default_engine()
            url = str(self.path)   # init_path made it a string
            try:
                spans = []
                for rel, pairs in ranges.items():
                    path = self.efs.concat_path(url, rel)
                    f = self.efs.pinned[str(path)] = self.efs.open_file(path)
                    spans += [Span(f.reader.source, a, b) for a, b in sorted(pairs) if b > a]
                prefetch = Prefetch(engine, spans)
                done = super().read_data(plan, planner)
                if "://" in url:  # the next resume prefetches what this load read
                    from bootseer.ckpt import credentials, profile
                    private = engine.staging.private_for(credentials.carried(url))
                    profile.save(engine.staging.dir, url, engine.recorder,
                                 store_url=engine.store_url, private=private)
                from bootseer.ckpt.stats import trace_load
                trace_load(engine.statistics(), engine.counters.started_wall,
                           url=url, via="dcp")
                return done
            finally:
                if prefetch is not None:
                    prefetch.stop()
                for f in self.efs.pinned.values():
                    f.close()
                self.efs.pinned.clear()

        def reset(self, checkpoint_id=None):
            super().reset(None)
            if checkpoint_id:
                self.path = self.fs.init_path(checkpoint_id)

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id) -> bool:
            return True

    return _Reader(path, engine)
