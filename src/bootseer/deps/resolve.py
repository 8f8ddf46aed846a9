"""SPEC -> exact pins with artifact hashes (uv), and the environment key."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bootseer.errors import BootseerError

FORMAT = 1


class DepsError(BootseerError):
    pass


def uv() -> list[str]:
    exe = shutil.which("uv")
    return [exe] if exe else [sys.executable, "-m", "uv"]


def _run(cmd: list[str], what: str, **kw) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-6:])
        raise DepsError(f"{what} failed: {tail}")
    return p.stdout


def refuse_editables(spec: Path) -> None:
    if spec.name != "requirements.txt" and spec.suffix not in (".txt", ".in"):
        return
    for n, line in enumerate(spec.read_text().splitlines(), 1):
        s = line.split("#", 1)[0].strip()
        if s.startswith(("-e", "--editable")) or re.match(r"^(file:|\.{0,2}/)", s):
            raise DepsError(f"{spec}:{n}: {s!r} is an editable or local path install, which "
                            f"cannot be snapshotted for other nodes; publish it as a wheel")


def interpreter(python: str) -> dict:
    code = ("import json,sys,sysconfig,platform;print(json.dumps({'impl':sys.implementation.name,"
            "'version':'%d.%d.%d'%sys.version_info[:3],'soabi':sysconfig.get_config_var('SOABI'),"
            "'platform':sysconfig.get_platform(),'libc':platform.libc_ver()}))")
    try:
        return json.loads(_run([python, "-c", code], f"probing {python}"))
    except (OSError, ValueError) as e:
        raise DepsError(f"cannot run interpreter {python}: {e}") from e


def resolve(spec: str, python: str, index_urls: list[str] | None = None) -> str:
    """Locked requirements text (``name==version --hash=sha256:...``)."""
    p = Path(spec)
    if not p.exists():
        raise DepsError(f"dependency spec {spec} does not exist")
    refuse_editables(p)
    idx = []
    for i, u in enumerate(index_urls or []):
        idx += ["--index-url" if i == 0 else "--extra-index-url", u]
    if p.name == "uv.lock":
        return _run([*uv(), "export", "--frozen", "--format", "requirements-txt", "--no-dev",
                     "--directory", str(p.parent)], f"uv export {spec}")
    ver = interpreter(python)["version"].rsplit(".", 1)[0]
    env = {**os.environ, "UV_NO_CONFIG": "1"}
    return _run([*uv(), "pip", "compile", "-q", "--generate-hashes", "--python-version", ver,
                 "--no-header", *idx, str(p)], f"resolving {spec} (uv pip compile)", env=env)


@dataclass(frozen=True)
class Resolved:
    key: str
    locked: str
    interp: dict
    portable: str
    """The key without the prefix: snapshots of these pins at another prefix."""
    pins: str
    """The pins alone: snapshots of them for another interpreter or platform."""


def environment_key(locked: str, interp: dict, prefix: str | None, *, base_image: str | None = None,
                    options: dict | None = None) -> str:
    """sha256 over what makes an environment reusable. Index URLs are not in it: the
    pins carry artifact hashes, so where they came from does not matter."""
    pins = sorted(l.strip() for l in locked.splitlines()
                  if l.strip() and not l.strip().startswith("#"))
    doc = {"format": FORMAT, "pins": pins, "python": {k: interp[k] for k in
                                                      ("impl", "version", "soabi", "platform")},
           "libc": interp.get("libc"),
           "prefix": os.path.abspath(prefix) if prefix is not None else None,
           "base_image": base_image, "options": options or {}}
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def pins_key(locked: str) -> str:
    pins = sorted(l.strip() for l in locked.splitlines()
                  if l.strip() and not l.strip().startswith("#"))
    return "sha256:" + hashlib.sha256(json.dumps(pins).encode()).hexdigest()


def python_of(interp: dict) -> str:
    return (f"{interp['impl']} {interp['version']} ({interp['soabi']}, {interp['platform']}"
            f"{', ' + '-'.join(interp['libc']) if interp.get('libc') else ''})")


def resolve_key(spec: str, prefix: str, python: str, index_urls=None) -> Resolved:
    locked = resolve(spec, python, index_urls)
    interp = interpreter(python)
    return Resolved(environment_key(locked, interp, prefix), locked, interp,
                    environment_key(locked, interp, None), pins_key(locked))
