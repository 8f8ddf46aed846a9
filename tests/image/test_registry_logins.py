"""Registry logins from the standard places (auth.json files, ~/.docker/config.json with
inline auths, per-registry credHelpers and a global credsStore) for `image convert` (skopeo
pull and referrer push) and the oci:// store. A real docker-registry with htpasswd, real
skopeo, and credential helpers that are real executables on PATH (their real interface:
``docker-credential-NAME get``, the server on stdin, JSON out)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from bootseer.errors import StoreError
from bootseer.store import logins
from bootseer.store.backends.oci import OciBackend
from bootseer.store.digest import sha256_digest
from tests.image.test_convert_registry import (PASSWORD, USER, bootseer, need_skopeo,
                                               one_error_line, push, tree_file)
from tests.image.test_image import oci_layout, tar_layer


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A user with no logins anywhere yet, and a bin directory on PATH for helpers."""
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for name in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "DOCKER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", f"{home / 'bin'}:{os.environ['PATH']}")
    return home


def helper(home: Path, name: str, logins_by_server: dict[str, tuple[str, str]],
           *, fail: str | None = None) -> Path:
    """``docker-credential-NAME``: answers ``get`` from its table, notes every server it
    was asked about in ``NAME.asked``; ``fail``: exits 1 saying that instead."""
    table = {s: {"ServerURL": s, "Username": u, "Secret": p}
             for s, (u, p) in logins_by_server.items()}
    script = home / "bin" / f"docker-credential-{name}"
    script.write_text(f"""#!/usr/bin/env python3
import json, sys
assert sys.argv[1:] == ["get"], sys.argv
server = sys.stdin.read().strip()
open({str(home / (name + '.asked'))!r}, "a").write(server + "\\n")
if {fail!r}:
    print({fail!r}); sys.exit(1)
table = {json.dumps(table)!r}
found = json.loads(table).get(server)
if found is None:
    print("credentials not found in native keychain"); sys.exit(1)
print(json.dumps(found))
""")
    script.chmod(0o755)
    return script


def inline(user: str, password: str) -> dict:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def write_json(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_the_files_are_read_in_podmans_order(home, tmp_path, monkeypatch):
    docker = write_json(home / ".docker/config.json", {"auths": {"r:5000": inline("d", "1")}})
    assert logins.find("r:5000") == logins.Login("d", "1")
    write_json(home / ".config/containers/auth.json",
               {"auths": {"https://r:5000": inline("c", "2")}})
    assert logins.find("r:5000") == logins.Login("c", "2")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    write_json(tmp_path / "run/containers/auth.json", {"auths": {"r:5000": inline("x", "3")}})
    assert logins.find("r:5000") == logins.Login("x", "3")
    env_file = write_json(tmp_path / "env.json", {"auths": {"r:5000": inline("e", "4")}})
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(env_file))
    assert logins.find("r:5000") == logins.Login("e", "4")
    assert logins.find("r:5000", authfile=docker) == logins.Login("d", "1")   # --authfile only
    assert logins.find("other:1") is None


@pytest.mark.slow
def test_docker_config_helpers_before_inline_auths(home):
    helper(home, "pass", {"r:5000": ("from-pass", "p1")})
    helper(home, "desktop", {"r:5000": ("from-desktop", "p2"), "s:1": ("s-user", "p3")})
    write_json(home / ".docker/config.json", {
        "credsStore": "desktop", "credHelpers": {"r:5000": "pass"},
        "auths": {"r:5000": {}, "t:2": inline("t-user", "p4")}})
    assert logins.find("r:5000") == logins.Login("from-pass", "p1")   # credHelpers first
    assert logins.find("s:1") == logins.Login("s-user", "p3")         # then credsStore
    assert logins.find("t:2") == logins.Login("t-user", "p4")         # store has none: inline
    assert (home / "pass.asked").read_text() == "r:5000\n"
    assert logins.find("u:3") is None


def test_a_namespaced_key_matches_its_repositories_the_longest_first(home):
    """Keys ``host/namespace...`` (podman login REGISTRY/NAMESPACE) as containers-auth.json
    says: the most specific key whose path components lead the repository's wins; a key
    with a scheme (docker's ``https://host/v1/``) names its host only."""
    write_json(home / ".config/containers/auth.json", {"auths": {
        "r:5000": inline("host", "1"), "r:5000/team": inline("team", "2"),
        "r:5000/team/app": inline("app", "3"), "https://s:1/v1/": inline("legacy", "4"),
        "t:2/ns": inline("ns-only", "5")}})
    assert logins.find("r:5000", repository="team/app") == logins.Login("app", "3")
    assert logins.find("r:5000", repository="team/app/sub") == logins.Login("app", "3")
    assert logins.find("r:5000", repository="team/app2") == logins.Login("team", "2")
    assert logins.find("r:5000", repository="other/x") == logins.Login("host", "1")
    assert logins.find("r:5000") == logins.Login("host", "1")
    assert logins.find("s:1", repository="v1/x") == logins.Login("legacy", "4")
    assert logins.find("t:2", repository="ns/img") == logins.Login("ns-only", "5")
    assert logins.find("t:2", repository="other/img") is None
    assert logins.find("t:2") is None


def test_a_helper_that_fails_or_is_missing_is_one_clear_error(home):
    helper(home, "broken", {}, fail="pass store is locked")
    write_json(home / ".docker/config.json", {"credHelpers": {"r:5000": "broken",
                                                              "q:1": "nowhere"}})
    with pytest.raises(logins.CredentialHelperError,
                       match=r"docker-credential-broken failed for r:5000 \(exit 1\): "
                             r"pass store is locked"):
        logins.find("r:5000")
    with pytest.raises(logins.CredentialHelperError, match="docker-credential-nowhere is "
                                                           "not on PATH"):
        logins.find("q:1")


@pytest.fixture
def auth_registry(registry_factory, tmp_path):
    from tests.image.test_convert_registry import need
    import shutil
    import subprocess
    need(shutil.which("htpasswd") is not None, "htpasswd missing (apt-get install apache2-utils)")
    subprocess.run(["htpasswd", "-Bbc", str(tmp_path / "htpasswd"), USER, PASSWORD],
                   check=True, capture_output=True)
    return registry_factory(htpasswd=str(tmp_path / "htpasswd"))


def test_convert_uses_a_credential_helper(home, auth_registry, tmp_path):
    """skopeo pulls and the referrer goes in with the helper's login; the password is
    printed nowhere."""
    need_skopeo()
    host = f"127.0.0.1:{auth_registry.port}"
    layout = oci_layout(tmp_path / "layout", [tar_layer([("hello", b"hi\n", "f")])])
    push(f"oci:{layout}", f"{host}/team/app:1", f"--dest-creds={USER}:{PASSWORD}")
    write_json(home / ".docker/config.json", {"credsStore": "vault"})
    helper(home, "vault", {host: (USER, PASSWORD)})
    store = tmp_path / "store"
    p = bootseer("image", "convert", f"{host}/team/app:1", "--store", store)
    assert p.returncode == 0, p.stderr
    assert tree_file(store, p.stdout.split()[-1], "hello") == b"hi\n"
    assert PASSWORD not in p.stdout + p.stderr
    assert (home / "vault.asked").read_text().splitlines() == [host, host]   # pull, push
    from bootseer.image import referrer
    repo = OciBackend(f"oci://{host}/team/app", username=USER, password=PASSWORD)
    subject = repo.get_manifest("1")[2]
    assert json.loads(repo.get_manifest(referrer.tag_for(subject))[0])["manifests"]

    # a global store whose helper is gone: a warning, and the pull goes on without a login
    (home / "bin/docker-credential-vault").unlink()
    gone = bootseer("image", "convert", f"{host}/team/app:1", "--store", store)
    assert gone.returncode == 1 and "cannot read image" in gone.stderr.splitlines()[-1]
    assert "docker-credential-vault is not on PATH" in gone.stderr
    # a registry's own helper that is gone: one error line
    write_json(home / ".docker/config.json", {"credHelpers": {host: "vault"}})
    gone = bootseer("image", "convert", f"{host}/team/app:1", "--store", store)
    assert gone.returncode == 1
    assert "docker-credential-vault is not on PATH" in one_error_line(gone)


def test_oci_store_logs_in_with_the_auth_file(home, auth_registry):
    url = f"oci://127.0.0.1:{auth_registry.port}/team/store"
    data = b"chunk of the store"
    digest = sha256_digest(data)
    with pytest.raises(StoreError, match="podman login"):
        OciBackend(url).write(digest, data)
    write_json(home / ".config/containers/auth.json",
               {"auths": {f"127.0.0.1:{auth_registry.port}": inline(USER, PASSWORD)}})
    store = OciBackend(url)
    assert store.write(digest, data) and store.read(digest) == data
    assert PASSWORD not in repr(store)


def test_namespaced_logins_for_the_oci_store_and_convert(home, auth_registry, tmp_path):
    """The registry's login is kept for the team's namespace; the host's own key holds a
    stale password: the store and convert's pull and referrer push take the team's."""
    need_skopeo()
    host = f"127.0.0.1:{auth_registry.port}"
    write_json(home / ".config/containers/auth.json", {"auths": {
        host: inline(USER, "stale"), f"{host}/team": inline(USER, PASSWORD)}})
    data = b"chunk of the store"
    store = OciBackend(f"oci://{host}/team/store")
    assert store.write(sha256_digest(data), data) and store.read(sha256_digest(data)) == data
    layout = oci_layout(tmp_path / "layout", [tar_layer([("hello", b"hi\n", "f")])])
    push(f"oci:{layout}", f"{host}/team/app:1", f"--dest-creds={USER}:{PASSWORD}")
    p = bootseer("image", "convert", f"{host}/team/app:1", "--store", tmp_path / "trees")
    assert p.returncode == 0, p.stderr
    assert tree_file(tmp_path / "trees", p.stdout.split()[-1], "hello") == b"hi\n"
    assert PASSWORD not in p.stdout + p.stderr
