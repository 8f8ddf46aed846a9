"""The environment's side of the settings: which ``BOOTSEER_*`` variables exist (a typo is
warned about), the variables a process passes its settings on with, and the few variables
that are not settings (a start's id, the ready file, the restart count, Slurm's and
Kubernetes' job facts), each with its accessor."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from typing import Any

from bootseer import jobenv
from bootseer.config.settings import SYSTEM_CONFIG_VAR, BootseerConfig, TraceConfig, setting_var

OTHER_VARIABLES = frozenset({
    jobenv.CONFIG_FILE, SYSTEM_CONFIG_VAR,   # the user's and the node's settings files
    # set by `bootseer run` for the command and its processes (docs/configuration.md)
    "BOOTSEER_ENV_PREFIX", "BOOTSEER_CKPT_DIR", jobenv.READY_FILE,
    "BOOTSEER_RESTART_COUNT", jobenv.TRACE_START, jobenv.TRACE_AUTO, jobenv.WARM_MODULES,
    # read by the deployment hooks and manifests in deploy/
    "BOOTSEER_SLURM_CONFIG", "BOOTSEER_SLURM_STATE",
    "BOOTSEER_IMAGE", "BOOTSEER_CKPT",
    # a Kubernetes Indexed Job's spec.completions, for peers (bootseer.peers.job)
    "BOOTSEER_JOB_COMPLETIONS",
})
"""``BOOTSEER_*`` variables that are not ``<SECTION>_<FIELD>`` settings."""

_OTHER_PREFIXES = ("BOOTSEER_TEST_",)   # the test suite's own switches


def known_variables() -> frozenset[str]:
    hints = typing.get_type_hints(BootseerConfig)
    fields = {setting_var(f.name, sf.name) for f in dataclasses.fields(BootseerConfig)
              for sf in dataclasses.fields(hints[f.name])}
    return frozenset(fields | OTHER_VARIABLES)


def unknown_variables(env: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``BOOTSEER_*`` names in ``env`` that nothing reads (a typo silently ignored would
    leave the default in force), each with the closest known name, if one is close."""
    import difflib
    env = os.environ if env is None else env
    known = known_variables()
    unknown = sorted(n for n in env if n.startswith("BOOTSEER_") and n not in known
                     and not n.startswith(_OTHER_PREFIXES))
    return [(n, next(iter(difflib.get_close_matches(n, known, n=1, cutoff=0.8)), None))
            for n in unknown]


def section_key(section: str, env: Mapping[str, str] | None = None
                ) -> tuple[tuple[str, str | None], ...]:
    """The variables a section's settings depend on, with their values: a cache of what
    was built from them is valid while this is unchanged."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(BootseerConfig)
    names = [setting_var(section, f.name) for f in dataclasses.fields(hints[section])]
    return tuple((n, env.get(n)) for n in (*names, jobenv.CONFIG_FILE, SYSTEM_CONFIG_VAR,
                                           "XDG_CONFIG_HOME"))


def trace_settings(env: Mapping[str, str] | None = None) -> jobenv.TraceSettings:
    """The recorder's settings: ``[trace]`` of the settings object, and this start's id."""
    env = os.environ if env is None else env
    try:
        c = BootseerConfig.from_env(env).trace
    except Exception:  # noqa: BLE001 - a bad setting elsewhere must not fail the traced job
        # (the raw variables instead)
        return jobenv.trace_settings(env)
    return jobenv.TraceSettings(location=c.location, job_id=c.job_id, attempt=c.attempt,
                                node=c.node, gpus=c.gpus, start=jobenv.trace_start(env))


def section_env(section: str, **values: Any) -> dict[str, str]:
    """Settings as the variables that give them to a process this one starts (it inherits
    the environment); a value that is None is left out."""
    return {setting_var(section, name): str(value) for name, value in values.items()
            if value is not None}


def trace_env(trace: TraceConfig, **values: Any) -> dict[str, str]:
    """``trace`` (with ``values`` in place of its fields) as variables: what a process
    started with them records under."""
    return section_env("trace", **{name: values.get(name, getattr(trace, name))
                                   for name in jobenv.TRACE_FIELDS})


def start_env(start: str) -> dict[str, str]:
    """This start's id as the variable its processes name their trace files with."""
    return {jobenv.TRACE_START: start}


def trace_start(env: Mapping[str, str] | None = None) -> str | None:
    """This start's id, when ``bootseer run`` gave it one (read as the job reads it)."""
    return jobenv.trace_start(env)


def trace_capture(env: Mapping[str, str] | None = None) -> str:
    """``BOOTSEER_TRACE_AUTO`` as given (``1``, the default: the job's Python processes
    record their start-up)."""
    return (os.environ if env is None else env).get(jobenv.TRACE_AUTO, "1")


def store_url_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The store URL the environment names, if it names one (not the file's, not the
    default)."""
    return (os.environ if env is None else env).get(setting_var("store", "url"))


def job_completions(env: Mapping[str, str] | None = None) -> str | None:
    """``BOOTSEER_JOB_COMPLETIONS``: a Kubernetes Indexed Job's ``spec.completions`` (its
    node count, for peers), as the pod template passes it."""
    return (os.environ if env is None else env).get("BOOTSEER_JOB_COMPLETIONS")


def slurm_settings_file(env: Mapping[str, str] | None = None) -> str:
    """``BOOTSEER_SLURM_CONFIG``: the site's settings for the Slurm hooks (docs/slurm.md)."""
    return (os.environ if env is None else env).get("BOOTSEER_SLURM_CONFIG") \
        or "/etc/bootseer/slurm.toml"


def slurm_job_vars(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What slurmd tells its prolog and epilog of the job (``SLURM_JOB_*``,
    ``SLURMD_NODENAME``)."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k.startswith("SLURM_JOB_") or k == "SLURMD_NODENAME"}


RESTART_COUNT_VARS = ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT",
                      "BOOTSEER_RESTART_COUNT")


def attempt_from_env(env: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """The attempt the environment gives, (number, variable), or None: the trace setting
    ``BOOTSEER_TRACE_ATTEMPT``, else the restart count a scheduler gives (Slurm's requeue
    count, torchelastic's restart count, a Kubernetes restart count passed by the downward
    API as ``BOOTSEER_RESTART_COUNT``)."""
    env = os.environ if env is None else env
    for name in (jobenv.trace_var("attempt"), *RESTART_COUNT_VARS):
        value = (env.get(name) or "").strip()
        if value.isdigit():
            return int(value), name
    return None
