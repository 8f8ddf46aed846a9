"""What the serving seam serves (``What``) and how (``Serving``): the vocabulary the
chooser answers in and every handle and server is labelled with, kept apart from the
chooser so that a server (devfuse's) can name its kind without importing the chooser
that probes it."""

from __future__ import annotations

import enum


class What(enum.Enum):
    TREE = "tree"
    ENV = "env"
    FILES = "files"


class Serving(enum.Enum):
    EROFS_LOCAL = "erofs-local"
    EROFS_FUSE_BLOB = "erofs-fuse-blob"
    FUSE_VIEW = "fuse"
    DEVFUSE = "devfuse"
    MFUSEPY = "mfusepy"
