"""The conventional startup path, kept as a mode of ``bootseer run`` so that every
technique can be switched off and measured against what people do today:

* image: ``podman pull`` of the whole image into private storage, then ``podman image
  mount`` of the unpacked layers (what a container engine does before any process starts);
* dependencies: ``python -m venv`` + ``pip install -r`` against the package index;
* checkpoint: one sequential stream per file into a local directory (the fuse-dfs way).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.node import proc as procs
from bootseer.node import tools
from bootseer.node.mounts import unmount_under

log = logging.getLogger(__name__)


class BaselineError(BootseerError):
    pass


class Cancel:
    """Lets another thread stop a baseline step: kills its subprocess, ends its copy loop."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def track(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.append(proc)
            if self.cancelled.is_set():
                proc.kill()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled.set()
            for p in self._procs:
                if p.poll() is None:
                    p.kill()


def _check(cmd: list[str], what: str, cancel: Cancel | None = None, **kw) -> str:
    # dies with us (podman pull, pip install); the calling thread waits for it to end
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=procs.preexec(), **kw)
    if cancel is not None:
        cancel.track(proc)
    out, err = proc.communicate()
    if cancel is not None and cancel.cancelled.is_set():
        raise BaselineError(f"{what}: cancelled")
    if proc.returncode != 0:
        raise BaselineError(f"{what} failed (exit {proc.returncode}): "
                            + tools.tool_message(err or out))
    return out


class PulledImage:
    """An image pulled and unpacked by podman into private storage under ``state_dir``."""

    def __init__(self, ref: str, state_dir: str, cancel: Cancel | None = None):
        self.ref, self.state_dir, self.cancel = ref, state_dir, cancel
        self._podman = ["podman", "--root", f"{state_dir}/r", "--runroot", f"{state_dir}/rr",
                        "--cgroup-manager", "cgroupfs", "--events-backend", "file",
                        "--storage-driver", "overlay"]
        self.rootfs: str | None = None

    def pull(self) -> str:
        """Pull every layer, unpack, mount; return the rootfs directory."""
        os.makedirs(self.state_dir, exist_ok=True)
        host = self.ref.split("/", 1)[0]
        # Plain http is allowed only to a registry on loopback (tests, the demo).
        tls = ["--tls-verify=false"] if host.startswith(("127.", "localhost", "[::1]")) else []
        _check([*self._podman, "pull", "-q", *tls, self.ref], f"podman pull {self.ref}",
               self.cancel)
        self.rootfs = _check([*self._podman, "image", "mount", self.ref],
                             f"podman image mount {self.ref}").strip()
        return self.rootfs

    def config(self) -> dict:
        """The pulled image's own settings (``env`` list, ``workdir``), as the lazy image
        hands them over, so both paths run CMD alike."""
        import json
        out = _check([*self._podman, "image", "inspect", "--format", "{{json .Config}}",
                      self.ref], f"podman image inspect {self.ref}")
        cfg = json.loads(out or "{}") or {}
        return {"env": cfg.get("Env"), "workdir": cfg.get("WorkingDir"),
                "entrypoint": cfg.get("Entrypoint"), "cmd": cfg.get("Cmd")}

    def unmount_all_command(self) -> list[str]:
        return [*self._podman, "image", "unmount", "--all", "--force"]

    def close(self) -> None:
        if self.rootfs:
            subprocess.run(self.unmount_all_command(), capture_output=True)
        unmount_under(self.state_dir)
        shutil.rmtree(self.state_dir, ignore_errors=True)


def pip_install(spec: str, prefix: str, *, python: str | None = None,
                index_urls: list[str] | None = None, cancel: Cancel | None = None) -> None:
    """``python -m venv PREFIX`` then ``PREFIX/bin/pip install -r SPEC``, no pip cache
    (a fresh node has none)."""
    python = python or sys.executable
    if Path(prefix).exists():
        shutil.rmtree(prefix)
    _check([python, "-m", "venv", prefix], f"python -m venv {prefix}", cancel)
    cmd = [f"{prefix}/bin/python", "-m", "pip", "install", "-q", "--no-cache-dir",
           "--disable-pip-version-check", "-r", spec]
    for i, url in enumerate(index_urls or []):
        cmd += ["--index-url" if i == 0 else "--extra-index-url", url]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    _check(cmd, f"pip install -r {spec}", cancel, env=env)


def _http_exists(url: str) -> bool:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD")):
            return True
    except urllib.error.URLError:
        return False


def _http_listing(url: str) -> list[str]:
    """Files under an nginx ``autoindex_format json`` directory URL, recursively."""
    import json
    import urllib.request
    with urllib.request.urlopen(url) as r:
        entries = json.load(r)
    files = []
    # nginx listings hide dotfiles, but a DCP checkpoint's index is ".metadata": probe it.
    if not any(e["name"] == ".metadata" for e in entries) and _http_exists(f"{url}.metadata"):
        files.append(f"{url}.metadata")
    for e in entries:
        if e["type"] == "directory":
            files += _http_listing(f"{url}{e['name']}/")
        else:
            files.append(f"{url}{e['name']}")
    return files


def single_stream_copy(url: str, dest: str, *, block: int = 1024**2,
                       cancel: Cancel | None = None) -> int:
    """Copy every file under ``url`` (any fsspec URL; for http, a directory URL ending in
    ``/`` with a JSON listing) into ``dest``, one stream at a time, sequentially.
    Returns bytes copied."""
    import fsspec
    if url.startswith(("http://", "https://")) and url.endswith("/"):
        fs, root = fsspec.filesystem("http"), url.rstrip("/")
        files = _http_listing(url)
    else:
        fs, root = fsspec.core.url_to_fs(url)
        root = root.rstrip("/")
        files = list(fs.find(root)) if fs.isdir(root) else [root]
    total = 0
    for path in files:
        rel = os.path.relpath(path, root) if path != root else os.path.basename(path)
        out = Path(dest) / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        with fs.open(path, "rb", block_size=block) as src, open(out, "wb") as dst:
            while chunk := src.read(block):
                if cancel is not None and cancel.cancelled.is_set():
                    raise BaselineError(f"copy of {url}: cancelled")
                dst.write(chunk)
                total += len(chunk)
    return total
