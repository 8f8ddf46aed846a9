"""The run launcher's view of the profiler: ``phase``/``mark`` that record into
``bootseer.trace`` when a trace location is configured and do nothing otherwise."""

from __future__ import annotations

import contextlib
import logging

log = logging.getLogger(__name__)


def _api():
    try:
        from bootseer import trace
    except ImportError:  # the profiler is optional for the launcher
        return None
    return trace if hasattr(trace, "phase") else None


@contextlib.contextmanager
def phase(name: str, **attrs):
    api = _api()
    if api is None:
        yield attrs
        return
    with api.phase(name, **attrs) as span:
        yield span


def mark(name: str, **attrs) -> None:
    api = _api()
    if api is not None and hasattr(api, "mark"):
        api.mark(name, **attrs)


def set_attrs(span, **attrs) -> None:
    """Attach attributes to a span from ``phase`` (a dict when tracing is off)."""
    if isinstance(span, dict):
        span.update(attrs)
    elif hasattr(span, "set"):
        span.set(**attrs)
    elif hasattr(span, "attrs"):
        span.attrs.update(attrs)
