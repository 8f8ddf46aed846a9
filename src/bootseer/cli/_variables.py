"""``BOOTSEER_*`` variables: which ones bootseer reads, so that a mistyped one
(``BOOTSEER_FETCH_RETRYS``, silently ignored, leaving the default in force) is said."""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Mapping

from bootseer.config import BootseerConfig


OTHER_VARIABLES = frozenset({
    "BOOTSEER_CONFIG",                     # the settings TOML file
    # set by `bootseer run` for the command and its processes (docs/configuration.md)
    "BOOTSEER_ENV_PREFIX", "BOOTSEER_CKPT_DIR", "BOOTSEER_READY_FILE",
    "BOOTSEER_RESTART_COUNT", "BOOTSEER_TRACE_START", "BOOTSEER_TRACE_AUTO",
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
    fields = {f"BOOTSEER_{f.name.upper()}_{sf.name.upper()}"
              for f in dataclasses.fields(BootseerConfig)
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
