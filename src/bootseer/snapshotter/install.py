"""Patch containerd's config for the bootseer proxy snapshotter, and roll the patch back.

containerd 1.6/1.7 read config version 2 (the CRI plugin is ``io.containerd.grpc.v1.cri``);
containerd 2.x reads version 3, where the CRI's image settings (the default snapshotter,
snapshot annotations) live in ``io.containerd.cri.v1.images`` and its runtimes in
``io.containerd.cri.v1.runtime``. The patch adds the proxy plugin and a runtime handler
whose per-runtime ``snapshotter`` is bootseer (honoured by containerd >= 1.7), so only pods
of that RuntimeClass use bootseer and system pods keep overlayfs: a node whose snapshotter
is down still starts CNI, kube-proxy and the agent itself. The node-wide default changes
only when asked (``default=True``).

The original file is kept byte for byte in ``<config>.bootseer-backup`` (created once, never
overwritten) and ``uninstall`` puts those bytes back; the config itself is only ever
replaced whole (temp file + ``os.replace``), so containerd never reads half a file.
"""

from __future__ import annotations

import copy
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootseer.errors import BootseerError


class InstallError(BootseerError, ValueError):
    """containerd's config cannot be patched: missing, not TOML, an unknown version."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


BACKUP_SUFFIX = ".bootseer-backup"
DEFAULT_CONFIG = "/etc/containerd/config.toml"

# (runtime table's plugin, image settings' plugin) per config version
_V2_CRI = 'io.containerd.grpc.v1.cri'
_V3_RUNTIME = 'io.containerd.cri.v1.runtime'
_V3_IMAGES = 'io.containerd.cri.v1.images'


@dataclass(frozen=True)
class Plan:
    """What an install would write: ``text`` is None when the file already holds it."""
    path: Path
    version: int
    text: str | None
    notes: tuple[str, ...]


def _load(path: Path) -> tuple[bytes, dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InstallError(f"{path}: no containerd config",
                           f"create it with `containerd config default > {path}`, "
                           "then rerun") from None
    try:
        return raw, tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InstallError(f"{path}: not TOML ({e}); left untouched",
                           "fix the file or restore it: containerd cannot read it either") from None


def _version(path: Path, conf: dict[str, Any]) -> int:
    v = conf.get("version")
    if v in (2, 3):
        return int(v)
    raise InstallError(f"{path}: containerd config version {v!r} is not supported "
                       "(2: containerd 1.6/1.7, 3: 2.x); left untouched",
                       "migrate it with `containerd config migrate` (2.x) or start from "
                       "`containerd config default`")


def _table(conf: dict[str, Any], *keys: str) -> dict[str, Any]:
    t = conf
    for k in keys:
        t = t.setdefault(k, {})
        if not isinstance(t, dict):
            raise InstallError(f"containerd config: {'.'.join(keys)} is not a table",
                               "fix that key by hand")
    return t


def patched(conf: dict[str, Any], *, socket: str, runtime_class: str, default: bool,
            version: int) -> dict[str, Any]:
    """``conf`` with bootseer's proxy plugin and runtime handler (a copy)."""
    out = copy.deepcopy(conf)
    _table(out, "proxy_plugins")[runtime_class] = {"type": "snapshot", "address": socket}
    if version == 2:
        cri = _table(out, "plugins", _V2_CRI, "containerd")
        images = cri
    else:
        cri = _table(out, "plugins", _V3_RUNTIME, "containerd")
        images = _table(out, "plugins", _V3_IMAGES)
    runtimes = _table(cri, "runtimes")
    base_name = cri.get("default_runtime_name", "runc")
    base = runtimes.get(base_name) if base_name != runtime_class else None
    handler = copy.deepcopy(base) if isinstance(base, dict) else {
        "runtime_type": "io.containerd.runc.v2"}
    handler["snapshotter"] = runtime_class
    runtimes[runtime_class] = handler
    # The CRI tells a snapshotter the image's digest and reference only with these on: how
    # bootseer recognises a converted image. overlayfs ignores them.
    images["disable_snapshot_annotations"] = False
    if default:
        images["snapshotter"] = runtime_class
    return out


def plan(path: Path, *, socket: str, runtime_class: str = "bootseer", default: bool = False,
         containerd_version: str | None = None) -> Plan:
    raw, conf = _load(path)
    version = _version(path, conf)
    new = patched(conf, socket=socket, runtime_class=runtime_class, default=default,
                  version=version)
    notes = []
    if version == 2 and containerd_version and containerd_version.startswith("1.6"):
        notes.append(f"containerd {containerd_version} ignores a runtime's own snapshotter: "
                     f"pods of RuntimeClass {runtime_class} still get overlayfs; hint: "
                     "upgrade to containerd >= 1.7, or pass --default to make bootseer "
                     "node-wide (read the bootstrap caveat in docs/kubernetes.md first)")
    return Plan(path, version, None if new == conf else dumps(new), tuple(notes))


def apply(p: Plan) -> bool:
    """Write the plan; keeps the original once. False when nothing had to change."""
    if p.text is None:
        return False
    backup = p.path.with_name(p.path.name + BACKUP_SUFFIX)
    if not backup.exists():
        with open(backup, "xb") as f:   # never overwrites a file someone else made
            f.write(p.path.read_bytes())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(backup, p.path.stat().st_mode & 0o777)
    _replace(p.path, p.text.encode())
    return True


def uninstall(path: Path) -> bool:
    """Put the original bytes back; False when there is no backup (nothing installed)."""
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    try:
        original = backup.read_bytes()
    except FileNotFoundError:
        return False
    _replace(path, original)
    backup.unlink()
    return True


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.bootseer-tmp")
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


# -- a minimal TOML writer: the value types a containerd config holds ---------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else _str(k)


def _str(s: str) -> str:
    out = s.replace("\\", "\\\\").replace('"', '\\"')
    out = "".join(c if c >= " " or c == "\t" else f"\\u{ord(c):04x}" for c in out)
    return f'"{out}"'


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise InstallError(f"containerd config: a value of type {type(v).__name__} cannot be "
                       "written", "patch the file by hand (docs/kubernetes.md)")


def dumps(conf: dict[str, Any]) -> str:
    lines: list[str] = []
    _emit(conf, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _emit(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    subs = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path:
        lines.append("")
        lines.append("[" + ".".join(_key(k) for k in path) + "]")
    for k, v in table.items():
        if k not in subs:
            lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in subs.items():
        _emit(v, [*path, k], lines)
