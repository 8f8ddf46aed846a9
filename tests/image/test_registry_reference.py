"""Where a ``docker://`` reference lives, as docker's reference grammar says: the first
path component is a registry host only if it has a ``.`` or a ``:``, is ``localhost``,
or has an upper-case letter; otherwise the image is on Docker Hub (``docker.io``, its
one-component names under ``library/``)."""

from __future__ import annotations

import json

import pytest

from bootseer.image.registry import RegistryOptions, registry_host, registry_repository


@pytest.mark.parametrize("spec, host, repository", [
    ("docker://alpine", "docker.io", "library/alpine"),
    ("docker://alpine:3", "docker.io", "library/alpine"),
    ("docker://alpine@sha256:" + "a" * 64, "docker.io", "library/alpine"),
    ("docker://team/app:2", "docker.io", "team/app"),
    ("docker://library/alpine", "docker.io", "library/alpine"),
    ("docker://docker.io/alpine", "docker.io", "library/alpine"),
    ("docker://index.docker.io/team/app", "docker.io", "team/app"),
    ("docker://localhost/app", "localhost", "app"),
    ("docker://localhost:5000/team/app:1", "localhost:5000", "team/app"),
    ("docker://127.0.0.1:5000/app@sha256:" + "b" * 64, "127.0.0.1:5000", "app"),
    ("docker://registry.example.com/a/b/c:tag", "registry.example.com", "a/b/c"),
    ("docker://Registry/app", "Registry", "app"),
    ("docker://[::1]:5000/app", "[::1]:5000", "app"),
])
def test_the_host_and_repository_of_a_reference(spec, host, repository):
    assert registry_host(spec) == host
    assert registry_repository(spec) == repository


@pytest.mark.parametrize("spec", ["alpine", "oci:/x:y", "docker-archive:/a.tar", "dir:/x"])
def test_other_transports_name_no_registry(spec):
    assert registry_host(spec) is None and registry_repository(spec) is None


def test_a_docker_hub_short_name_uses_the_docker_hub_login(tmp_path):
    """``alpine`` is docker.io's: the login saved under docker's legacy key is the one
    given to skopeo, never one looked up for a host called ``alpine``."""
    authfile = tmp_path / "logins.json"
    authfile.write_text(json.dumps({"auths": {
        "alpine": {"auth": "d3Jvbmc6d3Jvbmc="},                          # wrong:wrong
        "https://index.docker.io/v1/": {"auth": "aHViOnNlY3JldA=="}}}))   # hub:secret
    spec = "docker://alpine:3"
    opts = RegistryOptions(authfile=str(authfile))
    private = tmp_path / "private"
    private.mkdir()
    args = opts.skopeo_source_args(registry_host(spec), private, registry_repository(spec))
    assert "--src-tls-verify=true" in args
    [given] = [a.split("=", 1)[1] for a in args if a.startswith("--src-authfile=")]
    assert json.loads(open(given).read()) == {"auths": {"docker.io": {
        "auth": "aHViOnNlY3JldA=="}}}
