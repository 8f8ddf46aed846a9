"""Which GPU and InfiniBand devices a training container gets, decided before anything is
mounted (a node that cannot pass the GPUs asked for fails in a second, not after a pull).

GPUs come, in order of preference, from a CDI spec (``/etc/cdi``, ``/var/run/cdi``, as
written by ``nvidia-ctk cdi generate``: podman injects the devices, driver libraries and
hooks it lists), else from the NVIDIA device nodes themselves (``/dev/nvidia<N>``,
``nvidiactl``, ``nvidia-uvm``, ``nvidia-caps``), with the nvidia-container-toolkit OCI hook
when one is installed. ``/dev/infiniband`` goes in whole when present (RDMA).

Everything is looked up under a ``root`` prefix, so tests use a fake CDI spec and fake
device nodes (made with mknod in a temp dir) on a machine without a GPU.
"""

from __future__ import annotations

import glob
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from bootseer.errors import BootseerError

GPU_KIND = "nvidia.com/gpu"
CDI_DIRS = ("etc/cdi", "var/run/cdi")
HOOK_DIRS = ("usr/share/containers/oci/hooks.d", "etc/containers/oci/hooks.d")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
GPU_CHOICES = "all, none, auto or a list of GPU indices such as 0,1"
_HINT = "see docs/gpu.md"


class DeviceError(BootseerError):
    """The devices asked for cannot be passed into the container."""


@dataclass(frozen=True, slots=True)
class DeviceNode:
    host: str
    """The node on this machine (under the lookup root)."""
    target: str
    """Its path inside the container (``/dev/...``)."""


@dataclass(frozen=True, slots=True)
class DevicePlan:
    cdi: tuple[str, ...] = ()
    """Fully qualified CDI device names for podman's ``--device`` (``nvidia.com/gpu=0``)."""
    nodes: tuple[DeviceNode, ...] = ()
    """Device nodes to create in (chroot) or pass to (podman) the container."""
    hooks_dir: str | None = None
    """An OCI hooks directory holding the nvidia-container-toolkit hook (podman only)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables the hook reads (``NVIDIA_VISIBLE_DEVICES``)."""
    gpus: int = 0
    """How many GPUs the container gets (for the trace's GPU-seconds)."""

    def describe(self) -> str:
        parts = []
        if self.cdi:
            parts.append("CDI " + ", ".join(self.cdi))
        gpu_nodes = [n.target for n in self.nodes if re.fullmatch(r"/dev/nvidia\d+", n.target)]
        if gpu_nodes and not self.cdi:
            parts.append("device nodes " + ", ".join(gpu_nodes))
        if any(n.target.startswith("/dev/infiniband/") for n in self.nodes):
            parts.append("/dev/infiniband")
        return "; ".join(parts) or "no devices"


def parse_gpus(text: str) -> tuple[str, tuple[str, ...]]:
    """``all|none|auto|0,1`` -> (mode, indices). Indices may also be GPU UUIDs."""
    value = (text or "").strip().lower()
    if value in ("all", "none", "auto"):
        return value, ()
    items = tuple(i.strip() for i in (text or "").split(","))
    if not items or not all(re.fullmatch(r"\d+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-fA-F-/]+", i)
                            for i in items):
        raise DeviceError(f"--gpus {text!r}: expected {GPU_CHOICES}")
    return "list", items


def visible_from_env(env) -> tuple[str, ...] | None:
    """The GPUs a scheduler gave this job (Slurm gres and Kubernetes device plugins set
    these); None: no restriction."""
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        value = env.get(name)
        if value is None or value.strip().lower() in ("all", ""):
            continue
        if value.strip().lower() in ("none", "void", "-1"):
            return ()
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return None


# -- CDI ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CdiSpec:
    path: str
    kind: str
    devices: tuple[str, ...]


def _parse_spec_text(text: str, path: str) -> dict:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        import yaml  # optional: a CDI spec is usually YAML
    except ImportError:
        return _scan_yaml(text, path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise DeviceError(f"CDI spec {path} does not parse: {str(e).splitlines()[0]}") from e
    return data


def _scan_yaml(text: str, path: str) -> dict:
    """The two things needed from a CDI YAML spec (``kind`` and the device names) without
    a YAML library: top-level ``kind:`` and ``- name:`` items of the top-level ``devices:``."""
    kind, names, in_devices, item_indent = None, [], False, None
    for raw in text.splitlines():
        line = raw.split(" #")[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0 and not line.startswith("-"):   # "- " items may sit at column 0
            in_devices = line.startswith("devices:")
            m = re.fullmatch(r"kind:\s*['\"]?([^'\"]+)['\"]?", line)
            if m:
                kind = m.group(1).strip()
            elif not re.fullmatch(r"[A-Za-z][\w-]*:.*", line):
                raise DeviceError(f"CDI spec {path} does not parse: line {raw.strip()!r}")
            continue
        m = re.fullmatch(r"(\s*)- name:\s*['\"]?([^'\"]+)['\"]?", line)
        if in_devices and m and (item_indent is None or len(m.group(1)) == item_indent):
            item_indent = len(m.group(1))
            names.append(m.group(2).strip())
    return {"kind": kind, "devices": [{"name": n} for n in names]}


def load_cdi_specs(root: str = "/") -> list[CdiSpec]:
    """Every CDI spec under ``root``'s CDI directories; one that does not parse is an
    error naming the file (podman would refuse it later, with a longer message)."""
    specs = []
    for d in CDI_DIRS:
        for path in sorted(glob.glob(os.path.join(root, d, "*"))):
            if not path.endswith((".json", ".yaml", ".yml")) or not os.path.isfile(path):
                continue
            try:
                text = Path(path).read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise DeviceError(f"CDI spec {path} cannot be read: {e}") from e
            data = _parse_spec_text(text, path)
            if not isinstance(data, dict) or not isinstance(data.get("kind"), str) \
                    or not isinstance(data.get("devices"), list):
                raise DeviceError(f"CDI spec {path} does not parse: it needs a 'kind' and "
                                  f"a 'devices' list ({_HINT})")
            names = tuple(str(dev.get("name")) for dev in data["devices"]
                          if isinstance(dev, dict) and dev.get("name") is not None)
            specs.append(CdiSpec(path, data["kind"], names))
    return specs


# -- device nodes ---------------------------------------------------------------------------


def _char_devices_under(path: str) -> list[str]:
    found = []
    for dirpath, _dirs, files in os.walk(path):
        for name in sorted(files):
            p = os.path.join(dirpath, name)
            try:
                if stat.S_ISCHR(os.stat(p).st_mode):
                    found.append(p)
            except OSError:
                continue
    return found


def _node(root: str, host: str) -> DeviceNode:
    return DeviceNode(host, "/" + os.path.relpath(host, root))


def _gpu_nodes(root: str) -> dict[str, str]:
    """index -> host path of each ``/dev/nvidia<N>`` under ``root``."""
    return {m.group(1): p for p in glob.glob(os.path.join(root, "dev", "nvidia*"))
            if (m := re.fullmatch(r"nvidia(\d+)", os.path.basename(p)))}


def _hooks_dir(root: str) -> str | None:
    for d in HOOK_DIRS:
        if glob.glob(os.path.join(root, d, "*nvidia*.json")):
            return os.path.join(root, d)
    return None


def plan(gpus: str = "auto", *, runtime: str = "podman", root: str = "/", env=None,
         infiniband: bool = True) -> DevicePlan:
    """Decide the devices for ``--gpus`` on this node. Raises DeviceError (one line, what
    is missing) when GPUs are asked for and cannot be passed."""
    env = os.environ if env is None else env
    mode, wanted = parse_gpus(gpus)
    ib = tuple(_node(root, p) for p in _char_devices_under(os.path.join(root, "dev/infiniband"))
               ) if infiniband else ()
    if mode == "none":
        return DevicePlan(nodes=ib)
    if mode != "list":
        visible = visible_from_env(env)
        if visible == ():
            return DevicePlan(nodes=ib)
        wanted = visible or ()
    specs = [s for s in load_cdi_specs(root) if s.kind == GPU_KIND]
    if specs and runtime == "podman":
        return _plan_cdi(specs, wanted, ib)
    return _plan_nodes(root, mode, wanted, ib, runtime, gpus, cdi_found=bool(specs))


def _plan_cdi(specs: list[CdiSpec], wanted: tuple[str, ...], ib) -> DevicePlan:
    names = {n: s.path for s in specs for n in s.devices}
    if not wanted:
        if "all" in names:
            return DevicePlan(cdi=(f"{GPU_KIND}=all",), nodes=ib,
                              gpus=sum(1 for n in names if n.isdigit()))
        wanted = tuple(sorted((n for n in names if n.isdigit()), key=int))
        if not wanted:
            raise DeviceError(f"CDI spec {specs[0].path} lists no GPU (devices: "
                              f"{', '.join(names) or 'none'}); regenerate it with "
                              f"'nvidia-ctk cdi generate' ({_HINT})")
    missing = [w for w in wanted if w not in names]
    if missing:
        raise DeviceError(f"GPU {', '.join(missing)} is not in the CDI spec "
                          f"{', '.join(s.path for s in specs)} (devices: "
                          f"{', '.join(sorted(names))})")
    return DevicePlan(cdi=tuple(f"{GPU_KIND}={w}" for w in wanted), nodes=ib, gpus=len(wanted))


def _plan_nodes(root: str, mode: str, wanted: tuple[str, ...], ib, runtime: str,
                asked: str, cdi_found: bool) -> DevicePlan:
    by_index = _gpu_nodes(root)
    if not by_index:
        if mode == "auto":
            return DevicePlan(nodes=ib)
        where = " and ".join(os.path.join(root, d) for d in CDI_DIRS)
        cdi = ("a CDI spec (used by podman only)" if cdi_found
               else f"no CDI spec in {where}")
        raise DeviceError(f"--gpus {asked}: no GPU can be passed on this node: {cdi} and "
                          f"no {os.path.join(root, 'dev')}/nvidia<N> device nodes (is the "
                          f"NVIDIA driver loaded? {_HINT})")
    uuids = [w for w in wanted if not w.isdigit()]
    if uuids:
        raise DeviceError(f"GPU {uuids[0]}: without a CDI spec GPUs are chosen by index; "
                          f"generate one with 'nvidia-ctk cdi generate' ({_HINT})")
    chosen = wanted or tuple(sorted(by_index, key=int))
    missing = [w for w in chosen if w not in by_index]
    if missing:
        raise DeviceError(f"GPU {', '.join(missing)}: no {os.path.join(root, 'dev')}/nvidia"
                          f"{missing[0]} on this node (present: "
                          f"{', '.join(sorted(by_index, key=int))})")
    ctl = os.path.join(root, "dev/nvidiactl")
    if not os.path.exists(ctl):
        raise DeviceError(f"--gpus {asked}: {ctl} is missing (is the NVIDIA driver loaded? "
                          f"{_HINT})")
    nodes = [_node(root, by_index[i]) for i in chosen]
    for name in CONTROL_NODES:
        p = os.path.join(root, "dev", name)
        if os.path.exists(p):
            nodes.append(_node(root, p))
    nodes += [_node(root, p) for p in _char_devices_under(os.path.join(root, "dev/nvidia-caps"))]
    hooks = _hooks_dir(root) if runtime == "podman" else None
    env = {"NVIDIA_VISIBLE_DEVICES": ",".join(chosen)} if hooks else {}
    return DevicePlan(nodes=tuple(nodes) + ib, hooks_dir=hooks, env=env, gpus=len(chosen))
