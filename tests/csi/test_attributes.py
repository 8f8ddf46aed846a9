"""What a pod may write into a bootseer volume's attributes, and what the kubelet passes:
everything else refused with one line naming it (the plugin runs as root)."""

from __future__ import annotations

import pytest

from bootseer.csi.attributes import (
    CheckpointVolume,
    EnvironmentVolume,
    VolumeAttributeError,
    parse,
)

KUBELET = "/var/lib/kubelet"
TARGET = f"{KUBELET}/pods/0f1e/volumes/kubernetes.io~csi/env/mount"
KEY = "sha256:" + "ab" * 32
POD = {"csi.storage.k8s.io/pod.name": "train-0", "csi.storage.k8s.io/pod.namespace": "ml",
       "csi.storage.k8s.io/pod.uid": "0f1e", "csi.storage.k8s.io/ephemeral": "true",
       "csi.storage.k8s.io/serviceAccount.name": "default"}


def check(context, target=TARGET, volume_id="csi-4a5b", **kw):
    return parse(volume_id, target, context, kubelet_dir=KUBELET, **kw)


def test_an_environment_and_a_checkpoint_with_the_kubelets_attributes():
    v = check({"environment": KEY, **POD})
    assert v.source == EnvironmentVolume(KEY) and v.pod == "ml/train-0"
    v = check({"checkpoint": "https://ckpt.example/run7/step-100/", **POD})
    assert v.source == CheckpointVolume("https://ckpt.example/run7/step-100/")


@pytest.mark.parametrize("target, why", [
    (f"{KUBELET}/pods/0f1e/../../../../etc", "not a normal path"),
    (f"{KUBELET}/pods/../plugins/x/mount", "not a normal path"),
    ("/etc/cron.d", "not under /var/lib/kubelet/pods/"),
    (f"{KUBELET}/pods", "not under"),
    ("relative/mount", "not absolute"),
    (f"{KUBELET}/pods/0f1e//mount", "not a normal path"),
    (f"{KUBELET}/pods/0f1e/a,b/mount", "','"),
    ("", "not absolute"),
])
def test_a_target_path_outside_the_pods_directory_is_refused(target, why):
    with pytest.raises(VolumeAttributeError, match=why) as e:
        check({"environment": KEY}, target=target)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("context, why", [
    ({"environment": "sha256:../../etc/passwd"}, "not an environment key"),
    ({"environment": "../" + "a" * 64}, "not an environment key"),
    ({"environment": KEY.upper()}, "not an environment key"),
    ({"environment": KEY, "prefix": "/opt/x"}, "unknown volume attribute 'prefix'"),
    ({"environment": KEY, "csi.storage.k8s.io/other": "x"}, "unknown volume attribute"),
    ({"environment": KEY, "checkpoint": "https://a/b"}, "exactly one"),
    ({}, "exactly one"),
    ({"checkpoint": "file:///etc/"}, "not one of http"),
    ({"checkpoint": "/etc/shadow"}, "not one of http"),
    ({"checkpoint": "https://a/ckpt/../../secret"}, "'..' segment"),
    ({"checkpoint": "https://a/b c"}, "not a URL"),
    ({"environment": KEY, "csi.storage.k8s.io/ephemeral": "false"}, "inline ephemeral"),
])
def test_hostile_attributes_are_refused_in_one_line(context, why):
    with pytest.raises(VolumeAttributeError, match=why) as e:
        check(context)
    assert "\n" not in str(e.value)


def test_a_volume_id_that_is_not_a_name_is_refused():
    with pytest.raises(VolumeAttributeError, match="volume id"):
        check({"environment": KEY}, volume_id="../x")


def test_allowed_prefixes_bound_the_checkpoint_urls():
    ok = "s3://team-ckpt/run7/"
    assert check({"checkpoint": ok}, allowed_prefixes=("s3://team-ckpt/",)).source.url == ok
    with pytest.raises(VolumeAttributeError, match="--allow-checkpoint"):
        check({"checkpoint": "s3://other/run7/"}, allowed_prefixes=("s3://team-ckpt/",))


def test_a_token_in_a_refused_url_is_not_repeated():
    with pytest.raises(VolumeAttributeError) as e:
        check({"checkpoint": "ftp://user:s3cret@host/ckpt"})
    assert "s3cret" not in str(e.value)
