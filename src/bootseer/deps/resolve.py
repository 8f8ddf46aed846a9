"""SPEC -> exact pins with artifact hashes (uv), and the environment key."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bootseer import redact
from bootseer.errors import BootseerError
from bootseer.node.proc import preexec

FORMAT = 1


class DepsError(BootseerError):
    pass


def uv() -> list[str]:
    exe = shutil.which("uv")
    return [exe] if exe else [sys.executable, "-m", "uv"]


def _run(cmd: list[str], what: str, **kw) -> str:
    """Run a resolver or builder step; it dies with this process (a killed ``ensure``
    must not leave uv writing on)."""
    p = subprocess.run(cmd, capture_output=True, text=True,
                       preexec_fn=preexec(signal.SIGKILL), **kw)
    if p.returncode != 0:
        # uv's message as it wrote it (the CLI indents it under its own error line)
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-6:])
        raise DepsError(f"{what} failed: {redact.text(tail)}")   # an index URL's password
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
    locked = _run([*uv(), "pip", "compile", "-q", "--generate-hashes", "--python-version", ver,
                   "--no-header", *idx, str(p)], f"resolving {spec} (uv pip compile)", env=env)
    return keep_user_hashes(locked, user_hashes(p))


def _is_requirements(spec: Path) -> bool:
    return spec.name == "requirements.txt" or spec.suffix in (".txt", ".in")


def _logical_lines(text: str) -> list[str]:
    """Requirements lines with backslash continuations joined and comments dropped."""
    out, cur = [], ""
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line)
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        out.append((cur + line).strip())
        cur = ""
    if cur.strip():
        out.append(cur.strip())
    return [line for line in out if line]


def _project(line: str) -> str | None:
    m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    return re.sub(r"[-_.]+", "-", m[1]).lower() if m else None


_HASH = re.compile(r"--hash[=\s]\s*([A-Za-z0-9]+:[0-9A-Fa-f]+)")


def user_hashes(spec: Path, _seen: set | None = None) -> dict[str, set[str]]:
    """The ``--hash`` pins of a requirements file (and of the files it includes with
    ``-r``): ``{project: {"sha256:...", ...}}``. Other spec formats carry none."""
    seen = _seen if _seen is not None else set()
    if not _is_requirements(spec) or spec.resolve() in seen:
        return {}
    seen.add(spec.resolve())
    pins: dict[str, set[str]] = {}
    for line in _logical_lines(spec.read_text()):
        inc = re.match(r"(?:-r|--requirement)[=\s]\s*(\S+)", line)
        if inc:
            for project, hs in user_hashes(spec.parent / inc[1], seen).items():
                pins.setdefault(project, set()).update(hs)
            continue
        hashes = {h.lower() for h in _HASH.findall(line)}
        name = _project(line) if hashes else None
        if name:
            pins.setdefault(name, set()).update(hashes)
    return pins


def keep_user_hashes(locked: str, pins: dict[str, set[str]]) -> str:
    """The locked requirements with each user-pinned project's hashes replaced by the
    user's own, so that the install (``--require-hashes``) accepts only artifacts the user
    pinned, as pip does; the resolver regenerates hashes from the index, which would
    accept whatever the index serves. A pin that none of the index's artifacts matches
    fails here, before anything is built."""
    if not pins:
        return locked
    out = []
    for line in _logical_lines(locked):
        name = _project(line)
        if name not in pins:
            out.append(" ".join(line.split()))
            continue
        offered = {h.lower() for h in _HASH.findall(line)}
        wanted = pins[name]
        comparable = {h.split(":", 1)[0] for h in offered}
        if offered and all(h.split(":", 1)[0] in comparable for h in wanted) \
                and not offered & wanted:
            req = _HASH.sub("", line).split()[0]
            raise DepsError(f"{req}: no artifact the index offers matches the pinned hash "
                            f"{' or '.join(sorted(h[:19] + '...' for h in wanted))}: refusing "
                            f"to install it (fix the pin or the index)")
        req = " ".join(_HASH.sub("", line).split())
        out.append(" ".join([req, *(f"--hash={h}" for h in sorted(wanted))]))
    return "\n".join(out) + "\n"


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
    pins = sorted(line.strip() for line in locked.splitlines()
                  if line.strip() and not line.strip().startswith("#"))
    doc = {"format": FORMAT, "pins": pins, "python": {k: interp[k] for k in
                                                      ("impl", "version", "soabi", "platform")},
           "libc": interp.get("libc"),
           "prefix": os.path.abspath(prefix) if prefix is not None else None,
           "base_image": base_image, "options": options or {}}
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def pins_key(locked: str) -> str:
    pins = sorted(line.strip() for line in locked.splitlines()
                  if line.strip() and not line.strip().startswith("#"))
    return "sha256:" + hashlib.sha256(json.dumps(pins).encode()).hexdigest()


def python_of(interp: dict) -> str:
    return (f"{interp['impl']} {interp['version']} ({interp['soabi']}, {interp['platform']}"
            f"{', ' + '-'.join(interp['libc']) if interp.get('libc') else ''})")


def resolve_key(spec: str, prefix: str, python: str, index_urls=None) -> Resolved:
    locked = resolve(spec, python, index_urls)
    interp = interpreter(python)
    return Resolved(environment_key(locked, interp, prefix), locked, interp,
                    environment_key(locked, interp, None), pins_key(locked))
