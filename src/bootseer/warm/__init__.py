"""Warm starts: a per-node zygote (fork server) that has already imported what the job
imports before its first collective, and a worker launcher that has each worker served by
a fork of it, falling back to a cold exec on any miss. See docs/warm-start.md.

Standard library only below this package's own modules plus :mod:`bootseer.trace`, so
the zygote and the launcher run on the job's own interpreter.
"""

from bootseer.warm.key import key_difference, socket_path, warm_key

__all__ = ["warm_key", "key_difference", "socket_path"]
