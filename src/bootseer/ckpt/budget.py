"""One memory budget per process for every stripe in flight, all files together.

A stripe is charged from the moment it is requested until its bytes are written to the
staging file, so the process never holds more than the budget whatever the number of open
files or cursors (the read-ahead blow-ups of the research notes come from a window per open
file). Demand reads wait for room (back-pressure); read-ahead and plan prefetch only take
room that is free and no demand read is waiting for, so they never delay a reader.
"""

from __future__ import annotations

import threading

from bootseer.errors import ConfigError


class BudgetError(ConfigError):
    """The budget cannot hold even one stripe."""


class MemoryBudget:
    """Bytes of stripes in flight; ``peak`` and ``waits`` feed the load report."""

    def __init__(self, total: int, stripe_bytes: int):
        if total < stripe_bytes:
            raise BudgetError("ckpt.memory_budget_bytes",
                              f"{total} bytes is smaller than one stripe ({stripe_bytes} bytes);"
                              " raise the budget or lower ckpt.stripe_bytes")
        self.total, self.used, self.peak = total, 0, 0
        self.waits = 0
        self._demand_waiting = 0
        self._cond = threading.Condition()

    def try_acquire(self, n: int) -> bool:
        """For read-ahead: take ``n`` bytes only if they are free and no demand waits."""
        with self._cond:
            if self._demand_waiting or self.used + n > self.total:
                return False
            self._take(n)
            return True

    def acquire(self, n: int) -> None:
        """For a demand read: wait until ``n`` bytes are free. Never deadlocks: everything
        charged is a request in flight, which lands (or fails) and gives its bytes back."""
        with self._cond:
            if self.used + n > self.total:
                self.waits += 1
                self._demand_waiting += 1
                try:
                    while self.used + n > self.total:
                        self._cond.wait()
                finally:
                    self._demand_waiting -= 1
            self._take(n)

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()

    def wait_room(self, timeout_s: float) -> None:
        """Block until some bytes come back (or ``timeout_s``): for the plan prefetcher."""
        with self._cond:
            self._cond.wait(timeout_s)

    def _take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)
