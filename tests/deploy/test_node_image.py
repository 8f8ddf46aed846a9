"""deploy/node-image/Containerfile agrees with the project and the kustomize base: it
installs the wheel `uv build` makes with extras pyproject.toml defines, and its entrypoint
is `bootseer`, which the DaemonSet's containers give only the verb to. (Building it needs a
Debian base image from a registry, which the test machines do not reach: it is not built
by the tests.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy/node-image/Containerfile"


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_image_installs_the_wheel_with_extras_the_project_has():
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    m = re.search(r"bootseer-\*\.whl\)\[([a-z0-9,]+)\]", runs)
    assert m, "the wheel is installed with its extras"
    extras = set(m.group(1).split(","))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "containerd" in extras      # grpcio, protobuf: the snapshotter and the CSI plugin
    assert extras <= set(project["optional-dependencies"])
    assert "--no-index" in runs         # the Python dependencies come from the wheelhouse
    assert project["name"] == "bootseer"    # the wheel's file name, bootseer-*.whl


def test_the_entrypoint_is_bootseer_and_the_daemonset_gives_the_verb():
    entry = [rest for word, rest in instructions() if word == "ENTRYPOINT"]
    assert entry == ['["bootseer"]']
    ds = yaml.safe_load((REPO / "deploy/kubernetes/base/daemonset.yaml").read_text())
    csi = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "csi")
    assert "command" not in csi and csi["args"][:2] == ["csi", "serve"]
    assert csi["image"] == "bootseer/node"    # the name kustomize's images: rewrites
