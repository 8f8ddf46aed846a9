"""What bootseer needs from a node beyond Python, written once: each program, library and
optional module, the commands that need it, and the hint when it is missing; and the
message of a tool that failed, trimmed of its log noise (:func:`tool_message`).

``bootseer doctor`` checks every entry; a command that needs a missing one fails with the
same hint (:func:`require`), so what doctor says and what the command says never differ.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import json
import re
import shutil
from dataclasses import dataclass

from bootseer.errors import BootseerError


class MissingTool(BootseerError):
    """A program, library or module a command needs is not on this node."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True, slots=True)
class Requirement:
    name: str
    kind: str           # "program" (on PATH), "library" (loadable), "module" (importable)
    probe: str          # the program's, library's or module's own name
    needed_by: str      # the commands or paths that use it
    hint: str           # how to get it
    required: bool = False   # doctor's exit status: bootseer's core cannot work without it


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("fusermount3", "program", "fusermount3", "every lazy mount (its unmount)",
                "apt-get install fuse3", required=True),
    Requirement("libfuse3", "library", "fuse3", "FUSE tree views, image blob servers, "
                "checkpoint mounts without passthrough (mfusepy)",
                "apt-get install libfuse3-3", required=True),
    Requirement("skopeo", "program", "skopeo", "image convert (registries, archives, "
                "containers-storage)", "apt-get install skopeo"),
    Requirement("podman", "program", "podman", "bootseer run --image (else unshare + chroot)",
                "apt-get install podman"),
    Requirement("runc", "program", "runc", "bootseer run --image through podman",
                "apt-get install runc"),
    Requirement("containerd", "program", "containerd", "bootseer snapshotter serve",
                "apt-get install containerd"),
    Requirement("grpcio", "module", "grpc", "bootseer snapshotter serve",
                "pip install 'bootseer[containerd]'"),
    Requirement("protobuf", "module", "google.protobuf", "bootseer snapshotter serve",
                "pip install 'bootseer[containerd]'"),
    Requirement("libtorrent", "module", "libtorrent", "peers (a job's nodes sharing hot sets, "
                "BOOTSEER_PEERS_*)", "pip install 'bootseer[p2p]'"),
)
BY_NAME = {r.name: r for r in REQUIREMENTS}


def find(r: Requirement) -> str | None:
    """Where ``r`` is (a path, a library file, a module's origin), or None."""
    if r.kind == "program":
        return shutil.which(r.probe)
    if r.kind == "library":
        name = ctypes.util.find_library(r.probe)
        if name is None:
            return None
        try:
            ctypes.CDLL(name)   # listed in ld.so.cache is not loadable: it may be damaged
        except OSError:
            return None
        return name
    try:
        spec = importlib.util.find_spec(r.probe)
    except (ImportError, ValueError):   # a parent package missing, or set to None
        return None
    if spec is None:
        return None
    try:
        importlib.import_module(r.probe)   # found but broken (a missing shared library)
    except ImportError:
        return None
    return spec.origin or r.probe


def require(name: str, what: str | None = None) -> str:
    """The program or library ``name`` (a key of :data:`REQUIREMENTS`), or MissingTool
    naming ``what`` needs it, with the hint doctor gives."""
    r = BY_NAME[name]
    found = find(r)
    if found is None:
        raise MissingTool(f"{what or r.needed_by} needs {r.name}, which is not on this node "
                          f"({'PATH' if r.kind == 'program' else r.kind} searched)", r.hint)
    return found


# logrus, as skopeo, podman and buildah write it: time="..." level=fatal msg="..."
_LOGRUS = re.compile(r'^time="[^"]*"\s+level=(\w+)\s+msg=("(?:[^"\\]|\\.)*"|\S+)(.*)$')
_RETRIES = re.compile(r"\s*\(retrying (\d+) times?\)", re.I)
_RETRYING_IN = re.compile(r"retrying in [\d.]+m?s", re.I)
_QUIET = ("debug", "info", "warning", "warn", "trace")


def tool_message(output: str, limit: int = 300) -> str:
    """The message of a failed tool's standard error, for one error line: logrus lines
    (``time=... level=fatal msg="..."``) reduced to their message, informational ones
    dropped when an error is there, repeated retries said once ("3 tries, last: ..."),
    cut to ``limit`` characters from the end (the cause is last)."""
    messages, warned, said = [], 0, 0
    for line in output.strip().splitlines():
        m = _LOGRUS.match(line.strip())
        if m is None:
            if line.strip():
                messages.append(("error", line.strip()))
            continue
        level, msg = m.group(1).lower(), m.group(2)
        if msg.startswith('"'):
            try:
                msg = json.loads(msg)
            except ValueError:
                msg = msg.strip('"')
        if _RETRYING_IN.search(msg):
            warned += 1
            continue
        r = _RETRIES.search(msg)
        said = max(said, int(r.group(1)) if r else 0)
        messages.append((level, _RETRIES.sub("", msg).strip()))
    loud = [msg for level, msg in messages if level not in _QUIET] or [m for _, m in messages]
    unique = list(dict.fromkeys(loud))   # the same failure said on every retry: once
    text = unique[-1] if unique else ""
    tries = max(warned + 1 if warned else 0, said)
    if tries > 1:
        text = f"{tries} tries, last: {text}"
    return text if len(text) <= limit else "..." + text[-limit:]
