"""One settings object for all of bootseer (:mod:`.settings`: the sections, their files and
variables, sizes) and the environment's side of it (:mod:`.env`: which ``BOOTSEER_*``
variables exist, passing settings on to a child, the variables that are not settings).

This package is the one reader of ``BOOTSEER_*`` variables (with :mod:`bootseer.jobenv`,
the part a job's own processes read, shipped into images without bootseer)."""

from bootseer.config.env import (
    OTHER_VARIABLES,
    RESTART_COUNT_VARS,
    attempt_from_env,
    job_completions,
    known_variables,
    section_env,
    section_key,
    slurm_job_vars,
    slurm_settings_file,
    start_env,
    store_url_from_env,
    trace_capture,
    trace_env,
    trace_settings,
    trace_start,
    unknown_variables,
)
from bootseer.config.settings import (
    SYSTEM_CONFIG,
    SYSTEM_CONFIG_VAR,
    BootseerConfig,
    CacheConfig,
    CkptConfig,
    FetchConfig,
    Layer,
    MountConfig,
    PeersConfig,
    StoreConfig,
    TraceConfig,
    WarmConfig,
    absolute_store_url,
    config_files,
    effective,
    parse_size,
    setting_var,
)

__all__ = [
    "OTHER_VARIABLES", "RESTART_COUNT_VARS", "attempt_from_env", "job_completions",
    "known_variables", "section_env", "section_key", "slurm_job_vars", "slurm_settings_file",
    "start_env", "store_url_from_env", "trace_capture", "trace_env", "trace_settings",
    "trace_start", "unknown_variables",
    "SYSTEM_CONFIG", "SYSTEM_CONFIG_VAR", "Layer", "config_files", "effective",
    "BootseerConfig", "CacheConfig", "CkptConfig", "FetchConfig", "MountConfig",
    "PeersConfig", "StoreConfig", "TraceConfig", "WarmConfig", "absolute_store_url",
    "parse_size", "setting_var",
]
