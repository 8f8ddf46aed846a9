"""The settings of one start of a node, completed from its launcher before the pipelines
run: the job's node count and id (peers), the start's attempt number and id (trace), each
exported so that the processes the start runs (the job's, a mount's server) agree."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence

from bootseer.config import BootseerConfig, section_env, start_env, trace_env
from bootseer.peers.job import with_job as job_of
from bootseer.run import tracing
from bootseer.trace.record import new_start_id

log = logging.getLogger("bootseer.run")


def with_job(config: BootseerConfig, argv: Sequence[str],
             nodes_flag: int | None) -> BootseerConfig:
    """The job's node count and id from the launcher (peers turn on by themselves for
    N >= 2), also exported for the processes this run starts."""
    config = job_of(config, argv, os.environ, nodes_flag)
    os.environ.update(section_env("peers", nodes=config.peers.nodes,
                                  job_id=config.peers.job_id or None))
    return config


def with_attempt(config: BootseerConfig, asked: str) -> BootseerConfig:
    """This start's attempt number and id: starts are never merged into one attempt."""
    trace = config.trace
    try:
        attempt, source = tracing.resolve_attempt(
            asked, os.environ, job=trace.job_id or "job", node=trace.node or socket.gethostname(),
            store_url=config.store.url, config=config)
    except OSError as e:   # the store is down: the job still starts, its attempt unknown
        log.warning("cannot count this start in the store (%s): attempt %s; pass --attempt",
                    e, trace.attempt)
        attempt, source = trace.attempt, "default"
    log.info("attempt %d (from %s)", attempt, source)
    os.environ.update(start_env(new_start_id()))
    return config.replace(trace={"attempt": attempt})


def export_trace(config: BootseerConfig) -> None:
    """The profiler reads its settings from the environment (so that the command's own
    processes, which inherit it, record into the same trace)."""
    os.environ.update(trace_env(config.trace))
