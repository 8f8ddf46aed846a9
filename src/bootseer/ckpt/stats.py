"""The load report every checkpoint load produces: time to first byte, throughput, bytes
fetched versus consumed, stalls (a reader waiting on the network), hedged reads, and the
memory budget's peak."""

from __future__ import annotations

import dataclasses
import threading
import time


@dataclasses.dataclass(frozen=True, slots=True)
class LoadStats:
    first_byte_s: float | None
    """Seconds from the engine's start to the first byte handed to a reader."""
    last_byte_s: float | None
    """Seconds from the engine's start to the last byte handed to a reader so far."""
    elapsed_s: float
    bytes_consumed: int
    """Bytes handed to readers."""
    bytes_fetched: int
    """Bytes received from storage (hedged duplicates included)."""
    consumed_bytes_per_s: float
    fetched_bytes_per_s: float
    requests: int
    retries: int
    stalls: int
    """Reads that waited on the network."""
    stall_s: float
    hedged_reads: int
    """Stripes re-issued to another replica because they were slow."""
    failovers: int
    """Stripes served by another replica after one failed."""
    memory_budget_bytes: int
    memory_peak_bytes: int
    budget_waits: int
    passthrough_opens: int = 0
    """Opens of staged files the kernel served itself (FUSE passthrough): their reads
    never reach the engine, so the first/last byte times count the open instead."""
    passthrough_bytes: int = 0
    """Size of the files opened with passthrough."""
    peer_bytes: int = 0
    """Bytes staged from the job's peers (docs/peers.md); ``bytes_fetched`` is the origin's."""
    peers_role: str | None = None
    """This node's part in the peers' exchange: maker, peer, or origin (none came)."""

    @property
    def staged_per_read(self) -> float | None:
        """Bytes this node brought in (from storage and peers) per byte its readers read:
        1.0 when it stages exactly what its ranks load, ``nodes`` when every node stages a
        sharded checkpoint whole (ckpt/share.py)."""
        read = self.bytes_consumed + self.passthrough_bytes
        return round((self.bytes_fetched + self.peer_bytes) / read, 3) if read else None

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "staged_per_read": self.staged_per_read}


def trace_load(stats: LoadStats, started_wall: float, **attrs) -> None:
    """The load report as a ``ckpt.load`` phase of the trace (a no-op when no trace is
    configured, or when no reader read anything): from the first byte handed to a reader
    to the last (a mount lives much longer than the load through it), every figure an
    attribute."""
    if stats.first_byte_s is None:
        return
    from bootseer import trace
    trace.emit("ckpt.load", started_wall + stats.first_byte_s,
               started_wall + (stats.last_byte_s or stats.first_byte_s), **attrs,
               **{k: v for k, v in stats.as_dict().items() if v is not None})


class LoadCounters:
    """Mutable counters behind :class:`LoadStats` (thread-safe)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.first_byte_s: float | None = None
        self.last_byte_s: float | None = None
        self.bytes_consumed = 0
        self.passthrough_opens = 0
        self.passthrough_bytes = 0
        self.peer_bytes = 0
        self.peers_role: str | None = None
        self.stalls = 0
        self.stall_s = 0.0
        self.fetched_stripes = 0
        self._lock = threading.Lock()

    def add(self, **deltas: float) -> None:
        with self._lock:
            for name, v in deltas.items():
                setattr(self, name, getattr(self, name) + v)

    def consumed(self, source, start: int, end: int) -> None:
        """``[start, end)`` of ``source`` was handed to a reader."""
        now = time.monotonic() - self.started
        with self._lock:
            if self.first_byte_s is None:
                self.first_byte_s = now
            self.last_byte_s = now
            self.bytes_consumed += end - start

    def passed_through(self, size: int) -> None:
        """A staged file of ``size`` bytes was opened with passthrough: the kernel reads
        it, the engine never sees those reads."""
        now = time.monotonic() - self.started
        with self._lock:
            if self.first_byte_s is None:
                self.first_byte_s = now
            self.last_byte_s = now
            self.passthrough_opens += 1
            self.passthrough_bytes += size

    def snapshot(self, fetch: dict, budget) -> LoadStats:
        with self._lock:
            elapsed = max(time.monotonic() - self.started, 1e-9)
            return LoadStats(
                first_byte_s=self.first_byte_s, last_byte_s=self.last_byte_s,
                elapsed_s=elapsed,
                bytes_consumed=self.bytes_consumed, bytes_fetched=fetch["bytes"],
                consumed_bytes_per_s=self.bytes_consumed / elapsed,
                fetched_bytes_per_s=fetch["bytes"] / elapsed,
                requests=fetch["requests"], retries=fetch["retries"], stalls=self.stalls,
                stall_s=self.stall_s + fetch["stall_s"], hedged_reads=fetch["hedged_reads"],
                failovers=fetch["failovers"], memory_budget_bytes=budget.total,
                memory_peak_bytes=budget.peak, budget_waits=budget.waits,
                passthrough_opens=self.passthrough_opens,
                passthrough_bytes=self.passthrough_bytes, peer_bytes=self.peer_bytes,
                peers_role=self.peers_role)
