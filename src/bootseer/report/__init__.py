"""The read side of the profiler: load traces, explain one job (views, critical path,
sources of bytes), characterize a cluster, simulate one, and render or export the result.
The write side is ``bootseer.trace`` (a leaf every layer may import)."""
