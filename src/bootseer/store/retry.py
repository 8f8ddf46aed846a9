"""Repeating a store operation that failed for a reason expected to pass.

The fetcher retries reads with backoff and a deadline (fetch.py); this is the same rule
for the few writes that race other nodes (a registry calling a blob unknown while another
node's upload of it commits): a bounded number of attempts, a growing pause between them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def retry(call: Callable[[], T], *, attempts: int, transient: Callable[[BaseException], bool],
          pause_s: float, sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, again while it raises an error ``transient`` accepts, at most
    ``attempts`` times in all, pausing ``pause_s`` times the attempt's number between."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except Exception as e:
            if attempt == attempts or not transient(e):
                raise
            sleep(pause_s * attempt)
    raise ValueError(f"attempts must be >= 1, not {attempts}")
