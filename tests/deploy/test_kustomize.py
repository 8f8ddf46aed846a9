"""deploy/kubernetes/base and its example overlay: rendered by the real `kubectl kustomize`
(Debian's kubernetes-client), every rendered object valid against the Kubernetes schema
(kubernetes-validate, strict), and the parts that must agree with each other and with
bootseer do: the plugin's command line parses, the registrar points at the plugin's
socket, the CSIDriver serves inline volumes, the RuntimeClass names the handler containerd
is given. The pods that use the volumes need no hostPath and no privilege."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bootseer.cli.main import build_parser
from bootseer.csi import DRIVER_NAME
from bootseer.csi.attributes import parse
from tests.conftest import need

DEPLOY = Path(__file__).resolve().parents[2] / "deploy/kubernetes"
K8S_VERSION = "1.30.0"


def render(path: Path) -> list[dict]:
    need(shutil.which("kubectl") is not None,
         "kubectl is not installed (apt-get install kubernetes-client)")
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module", params=["base", "overlays/example"])
def rendered(request) -> list[dict]:
    return render(DEPLOY / request.param)


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def test_every_rendered_object_matches_the_kubernetes_schema(rendered):
    import kubernetes_validate
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds == ["CSIDriver", "ConfigMap", "DaemonSet", "Namespace", "RuntimeClass",
                     "ServiceAccount"]
    for doc in rendered:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_csidriver_serves_inline_volumes_with_pod_info(rendered):
    d = one(rendered, "CSIDriver")
    assert d["metadata"]["name"] == DRIVER_NAME and "namespace" not in d["metadata"]
    assert d["spec"]["volumeLifecycleModes"] == ["Ephemeral"]
    assert d["spec"]["podInfoOnMount"] is True and d["spec"]["attachRequired"] is False
    rc = one(rendered, "RuntimeClass")
    assert rc["metadata"]["name"] == "bootseer" and rc["handler"] == "bootseer"


def test_the_plugin_command_parses_and_the_registrar_finds_its_socket(rendered):
    ds = one(rendered, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    csi = containers["csi"]
    args = build_parser().parse_args([a.replace("$(KUBE_NODE_NAME)", "node1")
                                      for a in csi["args"]])
    assert args.command == "csi" and args.verb == "serve"
    assert args.endpoint == "unix:///csi/csi.sock" and args.node_id == "node1"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in csi["volumeMounts"]}
    socket_dir = volumes[mounts["/csi"]["name"]]["hostPath"]["path"]
    registrar = containers["node-driver-registrar"]["args"]
    assert f"--kubelet-registration-path={socket_dir}/csi.sock" in registrar
    assert socket_dir == f"/var/lib/kubelet/plugins/{DRIVER_NAME}"
    pods = mounts[f"{args.kubelet_dir}/pods"]
    assert pods["mountPropagation"] == "Bidirectional"
    assert volumes[pods["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pods"
    config = one(rendered, "ConfigMap")
    assert csi["envFrom"][0]["configMapRef"]["name"] == config["metadata"]["name"]
    assert {"BOOTSEER_STORE_URL", "BOOTSEER_CACHE_BUDGET_BYTES"} <= set(config["data"])
    assert pod["serviceAccountName"] == one(rendered, "ServiceAccount")["metadata"]["name"]


def test_the_overlay_sets_the_values():
    base, overlay = render(DEPLOY / "base"), render(DEPLOY / "overlays/example")
    assert one(overlay, "ConfigMap")["data"]["BOOTSEER_STORE_URL"] != \
        one(base, "ConfigMap")["data"]["BOOTSEER_STORE_URL"]
    image = one(overlay, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith("registry.corp.example:5000/")


def lazy_pod() -> dict:
    job = next(d for d in yaml.safe_load_all((DEPLOY / "lazy-job.yaml").read_text()) if d)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-lazy-0"},
            "spec": copy.deepcopy(job["spec"]["template"]["spec"])}


def test_a_pod_with_inline_bootseer_volumes_is_valid_and_baseline():
    import kubernetes_validate
    pod = lazy_pod()
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "bootseer"
    for v in spec["volumes"]:
        assert set(v) == {"name", "csi"}      # no hostPath: Pod Security "baseline"
        assert v["csi"]["driver"] == DRIVER_NAME and v["csi"]["readOnly"] is True
        target = f"/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/{v['name']}/mount"
        parse("csi-1", target, v["csi"]["volumeAttributes"], kubelet_dir="/var/lib/kubelet")
    for c in spec["containers"]:
        sc = c.get("securityContext", {})
        assert not sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False
    assert not any(spec.get(k) for k in ("hostPID", "hostIPC", "hostNetwork"))


def test_the_schema_check_catches_a_misspelled_csi_field():
    import kubernetes_validate
    pod = lazy_pod()
    v = pod["spec"]["volumes"][0]["csi"]
    v["volumeAttribute"] = v.pop("volumeAttributes")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
