"""GPU/InfiniBand device planning against a fake node: a CDI spec and device nodes made
with mknod under a temp root (no GPU needed)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from bootseer.run import container as C
from bootseer.run import devices as D
from tests.conftest import is_root, need

CDI_YAML = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia1
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
"""


def mknod(path, major=1, minor=3):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))


@pytest.fixture
def gpu_node(tmp_path):
    """A fake node with 2 GPUs, the control nodes, nvidia-caps and an InfiniBand port."""
    need(is_root(), "mknod needs root")
    root = tmp_path / "node"
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1",
                 "infiniband/uverbs0"):
        mknod(str(root / "dev" / name))
    return root


def write_cdi(root, text, name="nvidia.yaml", where="etc/cdi"):
    d = root / where
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)
    return d / name


def test_device_nodes_without_cdi(gpu_node):
    plan = D.plan("all", root=str(gpu_node), env={}, runtime="chroot")
    targets = [n.target for n in plan.nodes]
    assert targets[:2] == ["/dev/nvidia0", "/dev/nvidia1"]
    for t in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1",
              "/dev/infiniband/uverbs0"):
        assert t in targets
    assert plan.gpus == 2 and not plan.cdi
    # the scheduler's choice (Slurm gres, a device plugin) narrows "all"
    only = D.plan("auto", root=str(gpu_node), env={"CUDA_VISIBLE_DEVICES": "1"})
    assert [n.target for n in only.nodes if n.target.startswith("/dev/nvidia") and
            n.target[11:].isdigit()] == ["/dev/nvidia1"]
    flags = C.podman_option_flags(C.Options(devices=only))
    assert f"{gpu_node}/dev/nvidia1:/dev/nvidia1" in flags
    assert D.plan("none", root=str(gpu_node), env={}).gpus == 0


def test_toolkit_hook_is_used_when_installed(gpu_node):
    hooks = gpu_node / "usr/share/containers/oci/hooks.d"
    hooks.mkdir(parents=True)
    (hooks / "oci-nvidia-hook.json").write_text("{}")
    plan = D.plan("0", root=str(gpu_node), env={}, runtime="podman")
    assert plan.hooks_dir == str(hooks) and plan.env == {"NVIDIA_VISIBLE_DEVICES": "0"}
    flags = C.podman_option_flags(C.Options(devices=plan))
    assert flags[flags.index("--hooks-dir") + 1] == str(hooks)


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_cdi_spec_preferred_by_podman(gpu_node, fmt):
    if fmt == "yaml":
        write_cdi(gpu_node, CDI_YAML)
    else:
        write_cdi(gpu_node, json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
                                        "devices": [{"name": "0"}, {"name": "1"},
                                                    {"name": "all"}]}),
                  name="nvidia.json", where="var/run/cdi")
    plan = D.plan("all", root=str(gpu_node), env={}, runtime="podman")
    assert plan.cdi == ("nvidia.com/gpu=all",) and plan.gpus == 2
    flags = C.podman_option_flags(C.Options(devices=plan))
    assert flags[flags.index("nvidia.com/gpu=all") - 1] == "--device"
    assert [n.target for n in plan.nodes] == ["/dev/infiniband/uverbs0"]   # IB still passed
    picked = D.plan("auto", root=str(gpu_node), env={"NVIDIA_VISIBLE_DEVICES": "1"})
    assert picked.cdi == ("nvidia.com/gpu=1",)
    with pytest.raises(D.DeviceError, match="GPU 7 is not in the CDI spec"):
        D.plan("0,7", root=str(gpu_node), env={})
    # the chroot runtime cannot apply a CDI spec: it makes the device nodes
    assert not D.plan("all", root=str(gpu_node), env={}, runtime="chroot").cdi


def test_yaml_spec_read_without_a_yaml_library(monkeypatch, tmp_path):
    import builtins
    real_import = builtins.__import__

    def no_yaml(name, *a, **kw):
        if name == "yaml":
            raise ImportError("no yaml")
        return real_import(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_yaml)
    write_cdi(tmp_path, CDI_YAML)
    (spec,) = D.load_cdi_specs(str(tmp_path))
    assert spec.kind == "nvidia.com/gpu" and spec.devices == ("0", "1", "all")


def test_cdi_spec_that_does_not_parse_is_named(tmp_path):
    path = write_cdi(tmp_path, "cdiVersion: 0.5.0\nkind: [nvidia.com/gpu\n")
    with pytest.raises(D.DeviceError, match=f"CDI spec {path} does not parse"):
        D.plan("auto", root=str(tmp_path), env={})
    path.write_text('{"cdiVersion": "0.5.0"}')    # valid JSON, not a spec
    with pytest.raises(D.DeviceError, match=f"CDI spec {path} does not parse"):
        D.plan("all", root=str(tmp_path), env={})
    assert D.plan("none", root=str(tmp_path), env={}) == D.DevicePlan()   # not even read


def test_gpus_asked_on_a_node_without_them(tmp_path):
    (tmp_path / "dev").mkdir()
    assert D.plan("auto", root=str(tmp_path), env={}) == D.DevicePlan()   # auto: nothing
    with pytest.raises(D.DeviceError, match=r"no GPU can be passed.*no CDI spec in .*"
                       r"nvidia<N> device nodes"):
        D.plan("all", root=str(tmp_path), env={})
    with pytest.raises(D.DeviceError, match="expected all, none, auto"):
        D.parse_gpus("some")


def test_missing_index_and_control_node(gpu_node):
    with pytest.raises(D.DeviceError, match="GPU 3: no .*/dev/nvidia3"):
        D.plan("3", root=str(gpu_node), env={})
    os.unlink(gpu_node / "dev/nvidiactl")
    with pytest.raises(D.DeviceError, match="nvidiactl is missing"):
        D.plan("all", root=str(gpu_node), env={})


def test_training_defaults_and_network_check(tmp_path):
    flags = C.podman_option_flags(C.Options())
    assert flags[flags.index("--network") + 1] == "host"
    assert flags[flags.index("--ipc") + 1] == "host"
    nofile = [f for f in flags if f.startswith("nofile=")][0]
    import resource
    assert nofile == "nofile={0}:{0}".format(resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    sized = C.podman_option_flags(C.Options(shm_size=2 << 30))
    assert "--ipc" not in sized and sized[sized.index("--shm-size") + 1] == str(2 << 30)
    C.check_network("host", "chroot")
    C.check_network("none", "podman")
    with pytest.raises(C.ContainerError, match="chroot runtime supports host, none"):
        C.check_network("bridge", "chroot")
    with pytest.raises(C.ContainerError, match="no network namespace at"):
        C.check_network(f"ns:{tmp_path}/nope", "podman")
    need("podman" in C.available_runtimes(), "podman is not installed")
    with pytest.raises(C.ContainerError, match="podman has no such network"):
        C.check_network("no-such-net", "podman")
