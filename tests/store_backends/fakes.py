"""Fakes at the fsspec seam for the store backend tests."""

from __future__ import annotations


def register_fake_hdfs():
    """A small fsspec filesystem registered as ``hdfs``: a fake at the fsspec seam, so
    hdfs:// URLs route through the real url -> FsspecBackend code path."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class FakeHdfs(MemoryFileSystem):
        protocol = "hdfs"
        store: dict = {}
        pseudo_dirs = [""]

        @classmethod
        def _strip_protocol(cls, path):
            if path.startswith("hdfs://"):
                path = path[len("hdfs://"):]
                path = "/" + path.split("/", 1)[1] if "/" in path else "/"
            return MemoryFileSystem._strip_protocol(path)

    fsspec.register_implementation("hdfs", FakeHdfs, clobber=True)
    return FakeHdfs
