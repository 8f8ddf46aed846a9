"""A node's decoded TOCs, so that a start loads a tree's records instead of parsing and
checking its JSON again: ``<node cache>/tocs/<tree>``, written after the first mount of
the tree on the node (off the path to its job's start), read by every later start (the
mounting command and its blob server both load the TOC).

The file holds the records in ``marshal``'s form, which loads several times faster than
the JSON parses and is checked, under a header naming the format and the tree, against
a sha256 of its bytes. It is trusted only as the node's own: a regular file owned by this
user with no access for others, in a directory owned by this user that no one else may
write (a cache dir that is shared, or a file someone else could have placed, is never
read). A file that fails any check, names another tree or is of another format is not
used: the TOC is decoded from its verified blob as before, and the file written anew.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import marshal
import os
import stat
import threading
from pathlib import Path

from bootseer.node import partfile
from bootseer.tree.format import new_entry, new_ref
from bootseer.tree.toc import Toc, records_without_cycles

log = logging.getLogger(__name__)
MAGIC = b"bootseer.toc-decoded.v1\n"
DIR = "tocs"
KEEP = 64
"""Decoded TOCs a node keeps (a few MB for a tree of 30k files), the least recently
used removed first."""


def path_of(cache_root: str | os.PathLike[str], tree: str) -> Path:
    return Path(cache_root) / DIR / tree.removeprefix("sha256:")


def _private(st: os.stat_result, kind: int) -> bool:
    """Ours alone: of type ``kind``, owned by this user, no one else may write it (nor
    read a file)."""
    others = 0o077 if kind == stat.S_IFREG else 0o022
    return (stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.geteuid()
            and not st.st_mode & others)


def load(cache_root: str | os.PathLike[str], tree: str) -> Toc | None:
    """The decoded TOC of ``tree`` this node keeps, or None when there is none it can
    trust (said at info level: the caller decodes the TOC instead)."""
    path = path_of(cache_root, tree)
    try:
        if not _private(os.stat(path.parent), stat.S_IFDIR):
            log.info("%s is not this user's alone: its decoded TOCs are not used", path.parent)
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None   # none yet (or not a file): decoded from the blob
    try:
        with open(fd, "rb") as f:
            if not _private(os.fstat(f.fileno()), stat.S_IFREG):
                log.info("decoded TOC %s is not this user's alone: not used", path)
                return None
            data = f.read()
            os.utime(f.fileno())   # the clock of _keep_newest
    except OSError:
        return None
    return _parse(data, tree, path)


def _parse(data: bytes, tree: str, path: Path) -> Toc | None:
    head = MAGIC + tree.encode() + b"\n"
    if not data.startswith(head) or len(data) < len(head) + 65:
        log.info("decoded TOC %s is of another format or tree: not used", path)
        return None
    want, payload = data[len(head):len(head) + 64], data[len(head) + 65:]
    if hashlib.sha256(payload).hexdigest().encode() != want:
        log.warning("decoded TOC %s does not match its sum: not used", path)
        return None
    try:
        with records_without_cycles():
            chunk_size, packs, entries, meta, erofs, blocks = marshal.loads(payload)
            return Toc(chunk_size, packs, tuple([
                new_entry(p, ty, mode, uid, gid, mtime, size, target, rdev, xattrs,
                          None if chunks is None else tuple([new_ref(*c) for c in chunks]))
                for p, ty, mode, uid, gid, mtime, size, target, rdev, xattrs, chunks
                in entries]), meta, erofs, blocks)
    except (ValueError, EOFError, TypeError) as e:   # sum right, shape wrong: another writer
        log.warning("decoded TOC %s cannot be read (%s): not used", path, e)
        return None


def encode(tree: str, toc: Toc) -> bytes:
    """The file's bytes for ``toc`` of ``tree``."""
    entries = tuple((e.path, e.type, e.mode, e.uid, e.gid, e.mtime, e.size, e.target, e.rdev,
                     e.xattrs, None if e.chunks is None else
                     tuple((c.digest, c.pack, c.offset, c.stored, c.size) for c in e.chunks))
                    for e in toc.entries)
    payload = marshal.dumps((toc.chunk_size, tuple(toc.packs), entries, toc.meta, toc.erofs,
                             toc.blocks))
    return (MAGIC + tree.encode() + b"\n" + hashlib.sha256(payload).hexdigest().encode()
            + b"\n" + payload)


def save(cache_root: str | os.PathLike[str], tree: str, toc: Toc) -> None:
    """Keep ``toc`` (decoded from its verified, checked blob) for the node's next starts."""
    path = path_of(cache_root, tree)
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        partfile.sweep_dead(path.parent)   # what a killed writer left
        partfile.write_atomic(path, encode(tree, toc))   # mode 0600
        _keep_newest(path.parent, KEEP)
    except (OSError, ValueError) as e:   # a speed-up only: the next start decodes again
        log.info("cannot keep the decoded TOC of %s: %s", tree[:19], e)


def _keep_newest(directory: Path, keep: int) -> None:
    """Remove all but the ``keep`` most recently written or used decoded TOCs."""
    kept = []
    for p in directory.iterdir():
        try:
            kept.append((p.stat().st_mtime, p))
        except FileNotFoundError:
            continue
    for _, p in sorted(kept, reverse=True)[keep:]:
        p.unlink(missing_ok=True)


SAVE_AFTER_S = 5.0
"""How long after a mount its decoded TOC is kept: encoding it holds this process's GIL for
a tenth of a second or more, which the job's start (the same process starts it) must not
wait for."""


def save_later(cache_root: str | os.PathLike[str], tree: str, toc: Toc) -> None:
    """:func:`save`, off the path to the job's start: ``SAVE_AFTER_S`` after the mount, or
    at this process's exit if that comes first (a start shorter than that)."""
    if path_of(cache_root, tree).exists():
        return
    lock, done = threading.Lock(), threading.Event()

    def once() -> None:
        with lock:
            if not done.is_set():
                done.set()
                save(cache_root, tree, toc)
    timer = threading.Timer(SAVE_AFTER_S, once)
    timer.daemon = True
    timer.name = "bootseer-toc-keep"
    timer.start()
    atexit.register(once)
