"""The warm package shipped read-only into a container whose image has no bootseer (like
the trace shim): the zygote, the launcher and the supervisor with what they import, as a
``bootseer_warm`` package made from the very source files bootseer runs."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from pathlib import Path

from bootseer.warm.key import DIR_VAR, socket_dir

PACKAGE = "bootseer_warm"
CONTAINER_PKG_DIR = "/run/bootseer/warmpkg"
CONTAINER_DIR = "/run/bootseer/warm"
"""Where the zygote's socket and the module list live inside the container (bound from a
host directory per image and user, so the next start finds the list)."""
SHIPPED = {"key": "bootseer.warm.key", "proto": "bootseer.warm.proto",
           "session": "bootseer.warm.session", "worker": "bootseer.warm.worker",
           "zygote": "bootseer.warm.zygote", "supervisor": "bootseer.warm.supervisor",
           "jobenv": "bootseer.jobenv", "record": "bootseer.trace.record",
           "redact": "bootseer.redact"}
_REWRITES = (   # absolute bootseer imports -> the package's own copies
    (re.compile(r"^from bootseer import trace$", re.M), "from . import record as trace"),
    (re.compile(r"^from bootseer\.warm\.(\w+) import", re.M), r"from .\1 import"),
    (re.compile(r"^from bootseer(?:\.warm|\.trace)? import", re.M), "from . import"),
)


def write_package(dest) -> str:
    """Write ``bootseer_warm`` into ``dest`` (a directory to put on PYTHONPATH)."""
    pkg = Path(dest) / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    for name, dotted in SHIPPED.items():
        spec = importlib.util.find_spec(dotted)
        assert spec is not None and spec.origin, dotted
        text = Path(spec.origin).read_text()
        for pattern, repl in _REWRITES:
            text = pattern.sub(repl, text)
        (pkg / f"{name}.py").write_text(text)
    (pkg / "__init__.py").write_text('"""bootseer\'s warm starts, shipped by bootseer run '
                                     '(generated; standard library only)."""\n')
    return str(dest)


def host_dir(base: str, image: str) -> str:
    """This user's directory for ``image``'s zygote (0700): bound at CONTAINER_DIR.
    PermissionError: ``base`` is not a 0700 directory of this user."""
    root = socket_dir({DIR_VAR: base} if base else {})   # made 0700 and checked
    path = os.path.join(root, "image-" + hashlib.sha256(image.encode()).hexdigest()[:16])
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)   # ours: made just above inside our own 0700 directory
    return path


def image_python(argv: list[str]) -> str:
    """The job's interpreter when the command names one, else the image's python3."""
    return argv[0] if os.path.basename(argv[0]).startswith("python") else "python3"


def container_command(argv: list[str], *, max_rss_mb: int, timeout_s: float,
                      kept: bool = False) -> list[str]:
    """The container's command: the supervisor, on the job's interpreter when the command
    names one (else the image's python3). ``kept``: the zygote runs in a container of its
    own (run/warmkeep.py), the supervisor only routes the workers to it."""
    return [image_python(argv), "-m", f"{PACKAGE}.supervisor", "--max-rss", str(max_rss_mb),
            "--timeout", str(timeout_s), *(["--kept"] if kept else []), "--", *argv]


def in_container(pkg_dir, settings, image: str, argv: list[str], env: dict[str, str]
                 ) -> tuple[list[str], list[tuple[str, str, bool]]]:
    """What a container needs for its job to be served warm: the command (the supervisor
    around ``argv``) and its binds ``(source, target, readonly)``: the package read-only,
    this user's per-image directory read-write; ``env`` gets PYTHONPATH and the directory.
    ``settings``: the ``warm`` settings. PermissionError: a bad ``warm.dir``."""
    host = host_dir(settings.dir, image)
    pkg = write_package(pkg_dir)
    env["PYTHONPATH"] = ":".join(p for p in (CONTAINER_PKG_DIR, env.get("PYTHONPATH")) if p)
    env[DIR_VAR] = CONTAINER_DIR
    return (container_command(argv, max_rss_mb=settings.max_rss_mb,
                              timeout_s=settings.timeout_s),
            [(pkg, CONTAINER_PKG_DIR, True), (host, CONTAINER_DIR, False)])
