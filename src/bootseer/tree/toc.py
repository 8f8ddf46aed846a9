"""The records of a tree: its TOC (``Toc``), one ``Entry`` per path, and for each regular
file the ``ChunkRef`` of each of its chunks. Immutable: a TOC comes from the store (or the
builder) whole, and readers share it across threads. ``bootseer.tree.format`` turns them
into the stored bytes and back; ``bootseer.tree.validate`` checks a stored TOC first."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field

from bootseer.errors import BootseerError

VERSION = 1
KIND = "bootseer.tree"
TYPES = frozenset("fdlhcbp")   # file, dir, symlink, hard link, char/block device, fifo


class TreeFormatError(BootseerError, ValueError):
    """A blob is not a TOC this bootseer reads, or its TOC breaks a rule of the format."""


@contextlib.contextmanager
def records_without_cycles() -> Iterator[None]:
    """While a TOC's records (one per path and per chunk, none in a reference cycle) or
    tables of them are made: the cyclic collector, which would otherwise run again and
    again over the growing heap, waits until they are whole."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """One chunk of a file: addressed by the sha256 of its uncompressed bytes, stored
    zstd-compressed at ``offset`` in pack ``pack`` (an index into ``Toc.packs``)."""
    digest: str
    pack: int
    offset: int
    stored: int   # compressed bytes in the pack
    size: int     # uncompressed bytes

    @property
    def end(self) -> int:
        """The pack offset just past the chunk's stored bytes."""
        return self.offset + self.stored


@dataclass(frozen=True, slots=True)
class Entry:
    """One path of the tree. ``type`` is one of ``TYPES``; ``target`` is a symlink's text
    or a hard link's first path; ``rdev`` is a device node's (recorded, never served);
    ``xattrs`` maps names to base64 values; ``chunks`` is a regular file's chunk list.
    A field that does not apply is None (and absent from the stored TOC)."""
    path: str
    type: str
    mode: int   # permission bits only (see ``bootseer.tree.reader.TYPE_BITS``)
    uid: int
    gid: int
    mtime: float
    size: int
    target: str | None = None
    rdev: int | None = None
    xattrs: dict[str, str] | None = None
    chunks: tuple[ChunkRef, ...] | None = None


@dataclass(frozen=True, slots=True)
class Toc:
    """A tree: its chunk size, its packs (blob digests), its entries sorted by path, what
    the producer recorded about it (``meta``: an image's env, chain ids, ...), where the
    digests of its chunks' sub-chunk blocks are (``blocks``: ``{"digest", "block_size"}``
    of a :mod:`bootseer.tree.blocks` table; None for a tree built without one), and, when
    the producer stored them, its EROFS metadata images (``erofs``:
    ``bootseer.tree.meta_image``). Both are part of the tree's digest, so they are as
    trusted as its entries."""
    chunk_size: int
    packs: tuple[str, ...]
    entries: tuple[Entry, ...]
    meta: dict = field(default_factory=dict)
    erofs: dict | None = None
    blocks: dict | None = None

    def files(self) -> Iterator[Entry]:
        """The regular files (hard links excluded: they name one of these)."""
        return (e for e in self.entries if e.type == "f")

    def distinct_chunks(self) -> list[ChunkRef]:
        """Each chunk of the tree once, in the order entries first use it."""
        seen: set[str] = set()
        out = []
        for e in self.entries:
            for c in e.chunks or ():
                if c.digest not in seen:
                    seen.add(c.digest)
                    out.append(c)
        return out
