"""What makes a zygote valid for a worker (the key) and where its socket lives."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Mapping, Sequence

# Thread settings change numerics and what a parent may have run; the prefixes name the
# installed files. Per-start values (RANK, MASTER_ADDR...) stay out.
KEYED_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "TORCH_NUM_THREADS", "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV",
              "BOOTSEER_ENV_PREFIX")
# What a restored or built environment says it holds (deps.prefix.MARKER: its key); a
# prefix restored again with other packages at the same path is another environment.
ENV_MARKER = ".bootseer-env.json"

DIR_VAR = "BOOTSEER_WARM_DIR"
"""The setting ``warm.dir``, read here from the environment: the launcher runs in the job."""


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _files(argv: Sequence[str], cwd: str) -> dict[str, str]:
    """Digests of the script and of every argument naming an existing file (configs)."""
    out: dict[str, str] = {}
    for arg in argv:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        path = os.path.join(cwd, value)
        if value and os.path.isfile(path):
            try:
                out[value] = _digest(path)
            except OSError:
                out[value] = "unreadable"
    return out


def warm_key(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> dict[str, str]:
    """The key components of a worker ``argv`` run in ``env`` and ``cwd`` by this user."""
    key = {"python": f"{sys.executable} {sys.version.split()[0]}",
           "uid": str(os.getuid()), "cwd": os.path.realpath(cwd)}
    for name in KEYED_VARS:
        key[f"env.{name}"] = env.get(name, "")
    for name in ("BOOTSEER_ENV_PREFIX", "VIRTUAL_ENV"):
        marker = os.path.join(env.get(name) or "", ENV_MARKER)
        if env.get(name) and os.path.isfile(marker):
            try:
                key[f"installed.{name}"] = _digest(marker)
            except OSError:
                key[f"installed.{name}"] = "unreadable"
    for name, digest in _files(argv, cwd).items():
        key[f"file.{name}"] = digest
    return key


def key_difference(have: Mapping[str, str], want: Mapping[str, str]) -> str | None:
    """Which component differs (None: the keys are equal)."""
    for name in sorted(set(have) | set(want)):
        if have.get(name) != want.get(name):
            return f"key differs: {name}"
    return None


def socket_dir(env: Mapping[str, str] | None = None) -> str:
    """This user's zygote directory, made 0700 and checked: two users never share one."""
    uid = os.getuid()
    base = (os.environ if env is None else env).get(DIR_VAR) or f"/tmp/bootseer-warm-{uid}"
    os.makedirs(base, mode=0o700, exist_ok=True)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise PermissionError(f"{base} is not a 0700 directory of uid {uid}; remove it")
    return base


def socket_path(argv: Sequence[str], cwd: str, env: Mapping[str, str] | None = None) -> str:
    """The socket of the zygote slot for this script in this directory (the full key is
    checked over the socket, so a stale zygote answers with what differs)."""
    slot = hashlib.sha256(f"{os.path.realpath(cwd)}\0{argv[0] if argv else ''}".encode())
    return os.path.join(socket_dir(env), f"z-{slot.hexdigest()[:16]}.sock")
