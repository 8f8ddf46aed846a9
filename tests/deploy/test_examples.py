"""deploy/ examples: Kubernetes manifests pass the Kubernetes OpenAPI schema (strict), and
every `bootseer run` line in the examples parses with the real CLI. No cluster runs here."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from bootseer.cli.main import build_parser
from bootseer.cli.run import spec_from_args

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.30.0"


def k8s_docs():
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                yield pytest.param(doc, id=f"{path.name}#{i}-{doc.get('kind')}")


@pytest.mark.parametrize("doc", list(k8s_docs()))
def test_manifest_matches_kubernetes_schema(doc):
    import kubernetes_validate
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_schema_check_catches_a_broken_manifest():
    import kubernetes_validate
    doc = next(d for d in yaml.safe_load_all((DEPLOY / "kubernetes/train-job.yaml").read_text())
               if d and d["kind"] == "Job")
    doc["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privilegd"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_pod_has_what_bootseer_needs():
    job = next(d for d in yaml.safe_load_all((DEPLOY / "kubernetes/train-job.yaml").read_text())
               if d and d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["fuse"]["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert volumes["node-cache"]["hostPath"]["path"] == "/var/cache/bootseer"
    mounts = {m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"fuse", "node-cache"} <= mounts
    assert "SYS_ADMIN" in pod["containers"][0]["securityContext"]["capabilities"]["add"]


def bootseer_run_lines():
    """Each `bootseer run ...` invocation in the examples, with shell variables filled."""
    texts = [(p, p.read_text())
             for p in [DEPLOY / "torchrun/node.sh", DEPLOY / "slurm/train.sbatch"]]
    job = next(d for d in yaml.safe_load_all((DEPLOY / "kubernetes/train-job.yaml").read_text())
               if d and d["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    texts.append((Path("train-job.yaml"), container["args"][0]))
    for path, text in texts:
        text = text.replace("\\\n", " ")
        for m in re.finditer(r"exec bootseer run (.*?)(?=\n|'$|$)", text, re.S | re.M):
            line = re.sub(r"\$\(hostname\)", "node1", m.group(1))
            line = re.sub(r"\$\(([A-Z_]+)\)", r"\1", line)          # k8s $(VAR)
            line = re.sub(r"\$\{?([A-Z_]+)(:-[^}]*)?\}?", "1", line)  # shell $VAR / ${VAR:-x}
            line = line.replace("'\"", "").replace("\"'", "")
            yield pytest.param(shlex.split(line), id=f"{path.name}")


@pytest.mark.parametrize("argv", list(bootseer_run_lines()))
def test_example_command_lines_parse(argv):
    args = build_parser().parse_args(["run", *argv])
    spec = spec_from_args(args)
    assert spec.deps and spec.ckpt
    # train.sbatch runs on the host, as its user, from the environment the prolog restored
    assert spec.image or spec.argv[0] == f"{spec.prefix}/bin/torchrun"
    assert spec.argv[0].endswith("torchrun")


def test_shell_examples_are_valid_bash():
    for script in [DEPLOY / "torchrun/node.sh", DEPLOY / "slurm/train.sbatch"]:
        subprocess.run(["bash", "-n", str(script)], check=True)
