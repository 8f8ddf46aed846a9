"""Materialise a whole tree into a directory (environment restore, eager image pull):
every chunk fetched in parallel through the fetcher, verified, written in place.

The tree comes from the store and is untrusted: its TOC was checked when it was loaded
(``validate``), and every entry is still created relative to a descriptor of its parent
directory that this function created itself (``mkdir``/``open``/``symlink`` with
``dir_fd``, ``O_NOFOLLOW``, ``O_EXCL``), so no path can lead outside ``dest`` or through a
symlink of the tree. Set-id bits and privilege-granting xattrs are dropped unless asked for.
"""

from __future__ import annotations

import base64
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from bootseer.store.fetch import Priority
from bootseer.tree.reader import TreeReader

DECODE_THREADS = 3
DECODE_AHEAD = 64


SETID = 0o6000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _plan(entries: list[dict]) -> list[tuple[dict, dict, str]]:
    """(entry, the entry whose data and attributes it gets, action) in depth-first order,
    parents before children. The first name of a hard-linked file in that order is
    written; the others (the file's own path included) are links to it."""
    order = sorted(entries, key=lambda e: e["path"].split("/"))
    by_path = {e["path"]: e for e in entries}
    first: dict[str, str] = {}
    plan = []
    for e in order:
        t = e["type"]
        if t in ("f", "h"):
            target = e["target"] if t == "h" else e["path"]
            if target in first:
                plan.append((e, by_path[target], "link"))
            else:
                first[target] = e["path"]
                plan.append((e, by_path[target], "file"))
        elif t in ("d", "l"):
            plan.append((e, e, t))
        # device nodes and fifos are not restored
    return plan


def _first_use(plan: list[tuple[dict, dict, str]]):
    """Chunk refs in the order the writer needs them (each digest once)."""
    seen = set()
    for _, src, action in plan:
        if action != "file":
            continue
        for ref in src.get("chunks") or ():
            if ref[0] not in seen:
                seen.add(ref[0])
                yield ref


def _mode(e: dict, *, keep_privileges: bool, readonly: bool) -> int:
    mode = e["mode"] & 0o7777
    if not keep_privileges:
        mode &= ~SETID
    if readonly and e["type"] != "d":
        mode &= ~0o222
    return mode


def _xattrs(e: dict, keep_privileges: bool):
    """Name and value of each xattr to restore: only ``user.*`` ones unless privileges
    are kept (``security.capability`` grants what a setuid bit does)."""
    for name, value in e.get("xattrs", {}).items():
        if keep_privileges or name.startswith("user."):
            yield name, base64.b64decode(value)


def _set_xattrs(fd: int, e: dict, keep_privileges: bool) -> None:
    for name, value in _xattrs(e, keep_privileges):
        try:
            os.setxattr(fd, name, value)
        except OSError:
            pass   # a filesystem without xattrs (or this namespace) restores without them


def extract(reader: TreeReader, dest: str | Path, *, progress=None, chown: bool | None = None,
            readonly: bool = False, timing: dict | None = None,
            keep_privileges: bool = False) -> int:
    """Write the tree under ``dest`` (which must not exist or be empty). Returns bytes.
    ``timing`` gets ``fetched_at`` (wall time the last fetched chunk arrived) and
    ``chunks`` (how many were fetched). ``keep_privileges`` restores set-id bits and
    ``security.*``/``trusted.*`` xattrs (never for an environment)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    chown = (os.geteuid() == 0) if chown is None else chown
    entries = reader.toc["entries"]
    plan = _plan(entries)
    # Every chunk not already local is queued at once (the fetcher coalesces neighbours
    # in a pack into few large requests); files are then written in tree order as their
    # chunks arrive, so decompressing and writing overlap the transfer, and a chunk's
    # bytes are dropped once written (kept only while another file still needs them).
    uses: dict[str, int] = {}
    missing = {}
    for ref in reader.all_chunks():
        if not reader.has_chunk(ref):
            missing.setdefault(ref[0], ref)
    for e in entries:
        for ref in e.get("chunks") or ():
            uses[ref[0]] = uses.get(ref[0], 0) + 1
    refs = list(missing.values())
    pending = dict(zip((r[0] for r in refs), reader.submit_chunks(refs, Priority.DEMAND)))
    if timing is not None:
        timing["chunks"] = len(pending)

        def arrived(_fut) -> None:
            timing["fetched_at"] = time.time()
        for fut in pending.values():
            fut.add_done_callback(arrived)
    # Decompressing and verifying run on a few threads (zstd and sha256 release the GIL),
    # in the order the writer consumes chunks, at most DECODE_AHEAD chunks ahead.
    order = [r for r in _first_use(plan) if r[0] in pending]
    decoded: dict[str, Future] = {}
    nxt = 0
    kept: dict[str, bytes] = {}
    pool = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="bootseer-decode")

    def refill() -> None:
        nonlocal nxt
        while nxt < len(order) and len(decoded) < DECODE_AHEAD:
            r = order[nxt]
            nxt += 1
            fut = pending.pop(r[0])
            decoded[r[0]] = pool.submit(lambda r=r, fut=fut: reader._decompress(fut.result(), r))

    def chunk_bytes(ref: list, path: str) -> bytes:
        data = kept.get(ref[0])
        if data is None:
            refill()
            fut = decoded.pop(ref[0], None)
            if fut is not None:
                data = fut.result()
                if progress:
                    progress(ref[4])
            else:
                data = reader.chunk(ref, path)
        uses[ref[0]] -= 1
        if uses[ref[0]] > 0:
            kept[ref[0]] = data
        else:
            kept.pop(ref[0], None)
        return data

    opts = dict(keep_privileges=keep_privileges, readonly=readonly)
    root_fd = os.open(dest, _DIR_FLAGS)
    stack: list[tuple[str, int, dict | None]] = [("/", root_fd, None)]   # open directories
    linked: dict[str, tuple[int, int]] = {}   # hard-linked file -> (its fd, links to make)
    links_left: dict[str, int] = {}
    for e, src, action in plan:
        if action == "link":
            links_left[src["path"]] = links_left.get(src["path"], 0) + 1

    def close_dir(path: str, fd: int, e: dict | None) -> None:
        """Its entries are all made: now its owner, mode (may drop write), xattrs, times."""
        try:
            if e is not None:
                if chown:
                    os.fchown(fd, e["uid"], e["gid"])
                os.fchmod(fd, _mode(e, **opts))
                _set_xattrs(fd, e, keep_privileges)
                os.utime(fd, (e["mtime"], e["mtime"]))
        finally:
            if fd != root_fd:
                os.close(fd)

    def write_file(name: str, dir_fd: int, e: dict, src: dict) -> int:
        fd = os.open(name, _NEW_FILE, 0o600, dir_fd=dir_fd)
        written = 0
        try:
            with os.fdopen(os.dup(fd), "wb") as f:
                for ref in src["chunks"]:
                    data = chunk_bytes(ref, e["path"])
                    f.write(data)
                    written += len(data)
            if chown:   # owner, then mode (chown clears set-id bits), then times
                os.fchown(fd, src["uid"], src["gid"])
            os.fchmod(fd, _mode(src, **opts))
            _set_xattrs(fd, src, keep_privileges)
            os.utime(fd, (src["mtime"], src["mtime"]))
        except BaseException:
            os.close(fd)
            raise
        if links_left.get(src["path"]):
            linked[src["path"]] = (fd, links_left[src["path"]])
        else:
            os.close(fd)
        return written

    def link_file(name: str, dir_fd: int, src: dict) -> None:
        fd, left = linked[src["path"]]
        # linkat of the open file itself: no path of the tree is resolved again
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
        if left > 1:
            linked[src["path"]] = (fd, left - 1)
        else:
            del linked[src["path"]]
            os.close(fd)

    total = 0
    try:
        for e, src, action in plan:
            path = e["path"]
            if path == "/":
                stack[0] = ("/", root_fd, e)
                continue
            parent, name = path.rsplit("/", 1)
            parent = parent or "/"
            while stack[-1][0] != parent:
                if len(stack) == 1:   # validate() makes this unreachable; never guess
                    raise OSError(f"tree entry {path!r} has no directory to be created in")
                close_dir(*stack.pop())
            dir_fd = stack[-1][1]
            if action == "d":
                os.mkdir(name, 0o700, dir_fd=dir_fd)
                stack.append((path, os.open(name, _DIR_FLAGS, dir_fd=dir_fd), e))
            elif action == "l":
                os.symlink(e["target"], name, dir_fd=dir_fd)
                if chown:
                    os.chown(name, e["uid"], e["gid"], dir_fd=dir_fd, follow_symlinks=False)
            elif action == "file":
                total += write_file(name, dir_fd, e, src)
            else:
                link_file(name, dir_fd, src)
        while stack:
            close_dir(*stack.pop())
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        for _, fd, _ in stack[1:]:
            os.close(fd)
        for fd, _ in linked.values():
            os.close(fd)
        os.close(root_fd)
    return total
