"""The trace of a start, as the run launcher sets it up: the job's own trace inside its
container (the capture shim, its binds and variables), and which attempt a start is."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

from bootseer.config import attempt_from_env, trace_capture, trace_env, trace_start
from bootseer.jobenv import TRACE_AUTO, TRACE_START
from bootseer.run.container import Bind
from bootseer.store import open_store
from bootseer.store.digest import sha256_digest
from bootseer.trace import auto

# -- the job's own trace, inside its container ------------------------------------------------

# What the shim ships: the capture and what it imports from bootseer, all standard library
# only. Their ``from bootseer... import X`` lines become ``from . import X`` in the copy.
SHIM_MODULES = {"auto": "bootseer.trace.auto", "record": "bootseer.trace.record",
                "redact": "bootseer.redact", "jobenv": "bootseer.jobenv"}
SHIM_PACKAGE = "bootseer_shim"
CONTAINER_RUN_DIR = "/run/bootseer"
CONTAINER_TRACE_DIR = f"{CONTAINER_RUN_DIR}/trace"
CONTAINER_SHIM_DIR = f"{CONTAINER_RUN_DIR}/shim"
# Scheduler and launcher variables a job reads (ranks, rendezvous, NCCL tuning): they reach
# the container as they would reach the job on the host. --env wins over them.
PASSED_PREFIXES = ("SLURM_", "NCCL_", "TORCHELASTIC_", "PET_")
PASSED_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME",
                "TP_SOCKET_IFNAME", "OMP_NUM_THREADS", "JOB_COMPLETION_INDEX")


def _module_file(dotted: str) -> str | None:
    try:
        spec = importlib.util.find_spec(dotted)
    except ImportError:
        return None
    return spec.origin if spec and spec.origin else None


def write_shim(dest) -> str:
    """Write the capture shim into ``dest`` (a directory to put on PYTHONPATH): the
    ``sitecustomize`` of :func:`bootseer.trace.auto.site_dir` and a ``bootseer_shim``
    package made from the very source files bootseer runs, so there is one capture."""
    dest = Path(dest)
    pkg = dest / SHIM_PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(auto.site_dir()) / "sitecustomize.py", dest / "sitecustomize.py")
    shipped = {name: path for name, dotted in SHIM_MODULES.items()
               if (path := _module_file(dotted))}
    names = "|".join(shipped)
    relative = re.compile(rf"from bootseer(?:\.\w+)* import ({names})\b")
    for name, path in shipped.items():
        text = Path(path).read_text()
        (pkg / f"{name}.py").write_text(relative.sub(r"from . import \1", text))
    (pkg / "__init__.py").write_text(   # the capture is imported only where it is on
        '"""bootseer\'s trace capture, shipped by bootseer run (generated; standard library '
        'only)."""\n\n\ndef install():\n    from .auto import install\n    return install()'
        '\n\n\ndef ready():\n    from .auto import ready\n    ready()\n')
    return str(dest)


def passed_env(env) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k.startswith(PASSED_PREFIXES) or k in PASSED_NAMES}


def job_trace_env(trace, shim_dir: str, *, python_path: str | None = None,
                  gpus: int = 0) -> dict[str, str]:
    """What the job needs to record into this start's trace: the BOOTSEER_TRACE_* settings
    (location as the job sees it), the zero-code capture on PYTHONPATH."""
    env = {TRACE_AUTO: trace_capture(),
           "PYTHONPATH": ":".join(p for p in (shim_dir, python_path) if p),
           **trace_env(trace, gpus=trace.gpus or gpus or None)}
    start = trace_start()
    if start:
        env[TRACE_START] = start
    return env


def keep_capture(env: dict[str, str], trace_env: dict[str, str],
                 user_env: dict[str, str]) -> None:
    """A ``PYTHONPATH`` the user gives the job (``-e``) replaces the image's, never the
    capture's: the shim stays first on it, or the job records nothing."""
    shim = trace_env.get("PYTHONPATH", "").split(":")[0]
    if shim and "PYTHONPATH" in user_env:
        env["PYTHONPATH"] = ":".join(p for p in (shim, user_env["PYTHONPATH"]) if p)


def is_trace_dir(location: str | None) -> bool:
    return bool(location and "://" not in location)


# -- attempts ---------------------------------------------------------------------------------

def _ref_part(text: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".") or "_"
    return safe if safe == text else f"{safe[:64]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def count_start(store, job: str, node: str) -> int:
    """This node's start number for ``job`` (0 for its first start), from a counter in the
    store: one ref per start, created only if absent, so two starts never get one number."""
    prefix = f"trace/starts/{_ref_part(job)}/{_ref_part(node)}/"
    taken = [int(n) for name in store.list_refs(prefix) if (n := name[len(prefix):]).isdigit()]
    number = max(taken) + 1 if taken else 0
    data = json.dumps({"host": socket.gethostname(), "time": time.time()}).encode()
    digest = sha256_digest(data)
    store.write(digest, data)
    while not store.set_ref(f"{prefix}{number}", digest, exclusive=True):
        number += 1
    return number


def resolve_attempt(asked: str | None, env, *, job: str, node: str, store_url: str | None,
                    config=None) -> tuple[int, str]:
    """``--attempt N`` or ``auto``: (attempt, where it came from)."""
    if asked not in (None, "auto"):
        return int(asked), "--attempt"
    found = attempt_from_env(env)
    if found is not None:
        return found
    store = open_store(store_url, config)
    try:
        return count_start(store, job, node), "the store's start counter"
    finally:
        store.close()


def job_setup(trace, state_dir, *, in_container: bool, image_env: dict | None = None,
              gpus: int = 0):
    """(env, binds) that let the job record into this start's trace with no change to its
    image: the trace directory bound read-write, the shim read-only on PYTHONPATH. Nothing
    when tracing is off."""
    if not trace.location:
        return {}, []
    shim = write_shim(Path(state_dir) / "shim")
    if not in_container:
        return job_trace_env(trace, shim, python_path=os.environ.get("PYTHONPATH"),
                             gpus=gpus), []
    binds = [Bind(shim, CONTAINER_SHIM_DIR)]
    location = trace.location
    if is_trace_dir(location):
        os.makedirs(location, exist_ok=True)
        binds.append(Bind(os.path.abspath(location), CONTAINER_TRACE_DIR, readonly=False))
        location = CONTAINER_TRACE_DIR
    env = job_trace_env(dataclasses.replace(trace, location=location), CONTAINER_SHIM_DIR,
                        python_path=(image_env or {}).get("PYTHONPATH"), gpus=gpus)
    return {**passed_env(os.environ), **env}, binds
