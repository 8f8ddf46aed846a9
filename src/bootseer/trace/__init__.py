"""The startup profiler: record every phase on every node, explain a job, characterize a
cluster. Recording is a no-op until a trace location is configured
(``BOOTSEER_TRACE_LOCATION`` or ``bootseer run --trace``).

    from bootseer import trace
    with trace.phase("ckpt.load", bytes=n) as span:
        ...
        span.set(hits=3)
    trace.mark("ready")
"""

from bootseer.trace.record import emit, mark, phase, recorder, traced

__all__ = ["phase", "mark", "emit", "traced", "recorder"]
