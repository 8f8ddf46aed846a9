"""The striped read engine shared by the FUSE mount and the Python file API.

Files are read as stripes (``fetch.part_bytes``, 8 MiB by default), many in flight per
file and capped per host by the one fetcher. Per file, several cursors are tracked (a
process may read a file from many offsets, mmap readers jump): a read that continues a
cursor grows that cursor's read-ahead (2 stripes, doubling, up to the budget); a read
that matches no cursor fetches just the stripes it needs. Stripes land in a local staging
file (sparse) so a second load reads local disk, and in-flight + staged-but-unread
bytes are bounded by one node-wide memory budget (back-pressure: read-ahead is not
issued while the budget is used up). ``mode="single"`` is the fuse-dfs baseline: one
sequential stream per file, no read-ahead beyond the request.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from pathlib import Path

from bootseer.config import FetchConfig
from bootseer.store.fetch import Fetcher, Priority

from bootseer.ckpt.remote import RemoteFile, list_files

MAX_CURSORS = 8


class Budget:
    """Bytes of stripes in flight; read-ahead waits for room, demand reads never do."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self.cond = threading.Condition()
        self.peak = 0

    def try_take(self, n: int) -> bool:
        with self.cond:
            if self.used + n > self.limit:
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def take(self, n: int) -> None:
        with self.cond:
            self.used += n
            self.peak = max(self.peak, self.used)

    def give(self, n: int) -> None:
        with self.cond:
            self.used -= n
            self.cond.notify_all()


def staged_name(remote: RemoteFile) -> str:
    """The staging file name of one remote file version (path + size + mtime/etag);
    ``<name>.complete`` marks it fully staged."""
    return hashlib.sha256(remote.key.encode()).hexdigest()[:32]


class StagedFile:
    """One remote file, its stripes, its staging copy, its cursors."""

    def __init__(self, engine: "Engine", remote: RemoteFile):
        self.e, self.remote = engine, remote
        self.stripe = engine.stripe
        self.nstripes = (remote.size + self.stripe - 1) // self.stripe
        h = staged_name(remote)
        self.path = engine.staging / h
        self.done_marker = engine.staging / f"{h}.complete"
        self.done: set[int] = set(range(self.nstripes)) if self.done_marker.exists() else set()
        if not self.done:
            with io.open(self.path, "wb") as f:
                f.truncate(remote.size)
        self.inflight: dict[int, object] = {}
        self.failed: dict[int, Exception] = {}
        self.lock = threading.Lock()
        self.cursors: list[list[int]] = []   # [next expected offset, read-ahead stripes]
        self.fd = os.open(self.path, os.O_RDWR)

    def _span(self, i: int) -> tuple[int, int]:
        return i * self.stripe, min((i + 1) * self.stripe, self.remote.size)

    def _issue(self, i: int, priority: Priority, *, reserve: bool) -> object | None:
        """Start fetching stripe ``i`` (once). Read-ahead only if the budget has room."""
        with self.lock:
            if i in self.done or i >= self.nstripes:
                return None
            fut = self.inflight.get(i)
            if fut is not None:
                if priority == Priority.DEMAND:  # promote a queued read-ahead
                    self.e.fetcher.submit(self.remote, *self._span(i), priority=priority)
                return fut
            s, end = self._span(i)
            if reserve:
                if not self.e.budget.try_take(end - s):
                    return None
            else:
                self.e.budget.take(end - s)
            fut = self.e.fetcher.submit(self.remote, s, end, priority=priority)
            self.inflight[i] = fut
        fut.add_done_callback(lambda f, i=i, n=end - s: self._landed(i, f, n))
        return fut

    def _landed(self, i: int, fut, n: int) -> None:
        try:
            if fut.exception() is None:
                try:
                    os.pwrite(self.fd, fut.result(), i * self.stripe)
                except OSError as e:  # staging disk full: fail the readers, never hang
                    from bootseer.errors import CacheError
                    with self.lock:
                        self.failed[i] = CacheError(
                            f"cannot stage {self.remote.url} stripe {i} in {self.e.staging}: "
                            f"{e}", url=self.remote.url, offset=i * self.stripe)
                    return
                with self.lock:
                    self.done.add(i)
                    if len(self.done) == self.nstripes:
                        self.done_marker.touch()
                self.e.count("bytes_fetched", n)
        finally:
            with self.lock:
                self.inflight.pop(i, None)
            self.e.budget.give(n)

    def _stripe(self, i: int, priority=Priority.DEMAND) -> None:
        """Block until stripe ``i`` is staged (a failure raises)."""
        while True:
            with self.lock:
                if i in self.done:
                    return
                if i in self.failed:
                    raise self.failed.pop(i)
            fut = self._issue(i, priority, reserve=False)
            if fut is None:
                continue
            t0 = time.monotonic()
            fut.result()
            self.e.count("stall_s", time.monotonic() - t0)
            with self.lock:
                if i in self.done:
                    return
                if i in self.failed:
                    raise self.failed.pop(i)

    def _readahead(self, offset: int, size: int) -> None:
        with self.lock:
            cur = next((c for c in self.cursors if c[0] == offset), None)
            if cur is None:
                if len(self.cursors) >= MAX_CURSORS:
                    self.cursors.pop(0)
                cur = [offset, 0]
                self.cursors.append(cur)
            else:
                cur[1] = min(max(2, cur[1] * 2), self.e.max_ahead)
            cur[0] = offset + size
            ahead = cur[1]
        first = (offset + size) // self.stripe
        for i in range(first, min(first + ahead, self.nstripes)):
            self._issue(i, Priority.PREFETCH, reserve=True)

    def pread(self, size: int, offset: int) -> bytes:
        end = min(offset + size, self.remote.size)
        if offset >= end:
            return b""
        if self.e.mode == "single":
            data = self.e.fetcher.read(self.remote, offset, end)
            self.e.count("bytes_fetched", len(data))
            self.e.count("bytes_read", len(data))
            return data
        self._readahead(offset, end - offset)
        for i in range(offset // self.stripe, (end - 1) // self.stripe + 1):
            self._stripe(i)
        self.e.count("bytes_read", end - offset)
        return os.pread(self.fd, end - offset, offset)

    def prefetch_all(self) -> None:
        """Plan prefetch: every stripe in order, within the budget (waits for room)."""
        for i in range(self.nstripes):
            while self._issue(i, Priority.PREFETCH, reserve=True) is None:
                with self.lock:
                    if i in self.done or i in self.inflight:
                        break
                with self.e.budget.cond:
                    self.e.budget.cond.wait(0.1)
                if self.e.closed:
                    return

    def wait_idle(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                futs = list(self.inflight.values())
            if not futs:
                return
            for f in futs:
                try:
                    f.result(max(0.0, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - counted by the reader that needs it
                    pass

    def close(self) -> None:
        os.close(self.fd)


class Engine:
    def __init__(self, url: str, *, fetch: FetchConfig | None = None, staging: str | Path,
                 memory_budget: int = 1 << 30, mode: str = "striped"):
        self.url, self.mode = url, mode
        fetch = fetch or FetchConfig()
        if mode == "single":  # one stream: one request at a time, kernel-sized reads
            import dataclasses
            fetch = dataclasses.replace(fetch, max_inflight=1, connections_per_host=1)
        self.fetcher = Fetcher(fetch)
        self.stripe = fetch.part_bytes
        self.budget = Budget(memory_budget)
        self.max_ahead = max(2, memory_budget // self.stripe // 2)
        self.staging = Path(staging)
        self.staging.mkdir(parents=True, exist_ok=True)
        self.files = list_files(url)
        self._open: dict[str, StagedFile] = {}
        self._lock = threading.Lock()
        self.closed = False
        self.counters = {"bytes_fetched": 0, "bytes_read": 0, "stall_s": 0.0,
                         "first_byte_s": None}
        self.t0 = time.monotonic()

    def count(self, k: str, v) -> None:
        with self._lock:
            self.counters[k] += v
            if k == "bytes_read" and self.counters["first_byte_s"] is None:
                self.counters["first_byte_s"] = time.monotonic() - self.t0

    def file(self, path: str) -> StagedFile:
        with self._lock:
            f = self._open.get(path)
            if f is None:
                remote = self.files.get(path)
                if remote is None:
                    raise FileNotFoundError(f"{path}: not in checkpoint {self.url}")
                f = self._open[path] = StagedFile(self, remote)
            return f

    SMALL_FILE = 1 << 20

    def prefetch(self, plan: list[str] | None = None, *, start_after: str | None = None,
                 wait_max_s: float = 300.0) -> threading.Thread:
        """Stream the plan's files (default: all, small ones first) into staging.

        ``start_after``: a file whose creation releases the large files (small ones, such
        as DCP's ``.metadata``, go at once). ``bootseer run`` creates it when the image and
        the environment are prepared, so the checkpoint, needed only once the job has
        imported its code, does not take the link from what the job needs first."""
        order = plan or sorted(self.files, key=lambda p: (self.files[p].size, p))

        def run():
            nonlocal start_after
            for p in order:
                if self.closed:
                    return
                if start_after and self.files[p].size > self.SMALL_FILE:
                    deadline = time.monotonic() + wait_max_s
                    while not os.path.exists(start_after) and time.monotonic() < deadline \
                            and not self.closed:
                        time.sleep(0.05)
                    start_after = None
                try:
                    self.file(p).prefetch_all()
                except Exception:  # noqa: BLE001 - prefetch never fails the load
                    pass
            for p in order:
                if p in self._open:
                    self._open[p].wait_idle()
        t = threading.Thread(target=run, daemon=True, name="bootseer-ckpt-prefetch")
        t.start()
        return t

    def stats(self) -> dict:
        with self._lock:
            return {**self.counters, "peak_inflight_bytes": self.budget.peak,
                    "budget_bytes": self.budget.limit, **self.fetcher.counters()}

    def close(self) -> None:
        self.closed = True
        self.fetcher.close()
        for f in self._open.values():
            f.close()


class StripedReader(io.RawIOBase):
    """A binary file object over one remote file (readinto, seek, tell)."""

    def __init__(self, engine: Engine, path: str, owns_engine: bool = False):
        self.engine, self.f = engine, engine.file(path)
        self.pos, self.owns = 0, owns_engine

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.f.pread(len(b), self.pos)
        n = len(data)
        b[:n] = data
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.f.remote.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        if self.owns and not self.closed:
            self.engine.close()
        super().close()


def open(url: str, *, staging: str | None = None, fetch: FetchConfig | None = None,  # noqa: A001
         memory_budget: int = 1 << 30) -> io.BufferedReader:
    """A buffered binary file object reading ``url`` (one remote file) in stripes."""
    import tempfile
    staging = staging or tempfile.mkdtemp(prefix="bsckpt-")
    engine = Engine(url, fetch=fetch, staging=staging, memory_budget=memory_budget)
    (path,) = engine.files
    return io.BufferedReader(StripedReader(engine, path, owns_engine=True), buffer_size=1 << 20)
