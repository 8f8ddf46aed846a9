"""Materialise a whole tree into a directory (environment restore, eager image pull):
every chunk fetched in parallel through the fetcher, verified, written in place."""

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


def _first_use(entries: list[dict]):
    """Chunk refs in the order the writer needs them (each digest once)."""
    seen = set()
    for e in entries:
        for ref in e.get("chunks") or ():
            if ref[0] not in seen:
                seen.add(ref[0])
                yield ref


def extract(reader: TreeReader, dest: str | Path, *, progress=None, chown: bool | None = None,
            readonly: bool = False, timing: dict | None = None) -> int:
    """Write the tree under ``dest`` (which must not exist or be empty). Returns bytes.
    ``timing`` gets ``fetched_at`` (wall time the last fetched chunk arrived) and
    ``chunks`` (how many were fetched)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    chown = (os.geteuid() == 0) if chown is None else chown
    entries = reader.toc["entries"]
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
    order = [r for r in _first_use(entries) if r[0] in pending]
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

    try:
        total = 0
        dirs = []
        for e in entries:
            target = dest / e["path"].lstrip("/")
            t = e["type"]
            if t == "d":
                target.mkdir(parents=True, exist_ok=True)
                dirs.append((target, e))
                continue
            if t == "l":
                os.symlink(e["target"], target)
            elif t == "h":
                os.link(dest / e["target"].lstrip("/"), target)
                continue
            elif t == "f":
                with open(target, "wb") as f:
                    for ref in e["chunks"]:
                        data = chunk_bytes(ref, e["path"])
                        f.write(data)
                        total += len(data)
                    f.flush()
                    fd = f.fileno()   # owner, then mode (chown clears setuid), then times
                    if chown:
                        os.fchown(fd, e["uid"], e["gid"])
                    os.fchmod(fd, e["mode"] & (~0o222 if readonly else 0o7777))
                    os.utime(fd, (e["mtime"], e["mtime"]))
            else:
                continue  # device nodes and fifos are not restored
            if chown and t != "f":
                os.lchown(target, e["uid"], e["gid"])
            for name, value in e.get("xattrs", {}).items():
                try:
                    os.setxattr(target, name, base64.b64decode(value), follow_symlinks=False)
                except OSError:
                    pass
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    for target, e in reversed(dirs):  # after the files: modes may remove write permission
        if chown:
            os.lchown(target, e["uid"], e["gid"])
        os.chmod(target, e["mode"] & 0o7777)   # read-only applies to files
        os.utime(target, (e["mtime"], e["mtime"]))
    return total
