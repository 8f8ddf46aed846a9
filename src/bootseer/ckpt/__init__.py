"""Striped checkpoint reads: a FUSE mount, a Python file API and a torch DCP reader over one
engine (stripes in flight under one memory budget per process: the mount's server, a
prefetch, a reader; growing read-ahead)."""

# ``open`` shadows the builtin here on purpose: ``bootseer.ckpt.open`` is its counterpart.
from bootseer.ckpt.api import CkptFile, default_engine, open

__all__ = ["CkptFile", "default_engine", "open"]
