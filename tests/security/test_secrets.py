"""Issue 18 items 2 and 14: credentials in a checkpoint URL (``user:password@``, presigned
query signatures) never reach a file bootseer writes (traces, staging, access profiles,
store blobs and refs, logs) or an error; credentials can come without argv (settings,
netrc); what is staged with credentials is private."""

from __future__ import annotations

import base64
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bootseer.ckpt
from bootseer import redact
from bootseer.ckpt.engine import Engine
from bootseer.config import BootseerConfig, CkptConfig
from bootseer.errors import StoreError

pytestmark = pytest.mark.timeout(120)
PW = "Pw-7f3kQzX9"
SIG = "SiG0a1b2c3d4e5f6"
SECRETS = [PW.encode(), SIG.encode(), base64.b64encode(f"alice:{PW}".encode())]
DATA = os.urandom(3 * 1024 * 1024 + 5)


@pytest.fixture
def server(nginx_factory, tmp_path):
    """nginx: ``/secure/ckpt/`` needs basic auth (alice, PW), ``/open/ckpt/`` does not."""
    www = tmp_path / "www"
    for part in ("secure", "open"):
        (www / part / "ckpt").mkdir(parents=True)
        (www / part / "ckpt/model.bin").write_bytes(DATA)
        (www / part / "ckpt/meta.json").write_text('{"step": 7}')
    hashed = subprocess.run(["openssl", "passwd", "-apr1", PW], capture_output=True,
                            text=True, check=True).stdout.strip()
    users = tmp_path / "nginx-users"
    users.write_text(f"alice:{hashed}\n")
    return nginx_factory(www, extra_locations=(
        f'location /secure/ {{ auth_basic "ckpt"; auth_basic_user_file {users}; '
        "autoindex on; autoindex_format json; }"))


def _leaks(root: Path, skip: tuple[str, ...]) -> list[str]:
    found = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink() and not any(s in p.parts for s in skip):
            data = p.read_bytes()
            found += [f"{p}: {s.decode()}" for s in SECRETS if s in data]
    return found


def _assert_clean(text: str) -> None:
    for s in SECRETS:
        assert s.decode() not in text, text


def test_redaction_of_urls_and_text():
    u = f"https://alice:{PW}@h:8/ckpt/m.bin?X-Amz-Signature={SIG}&X-Amz-Credential=AK%2Fx&part=2"
    assert redact.url(u) == ("https://***@h:8/ckpt/m.bin?X-Amz-Signature=***"
                             "&X-Amz-Credential=***&part=2")
    assert redact.strip(u) == "https://h:8/ckpt/m.bin?part=2"
    assert redact.has_credentials(u) and not redact.has_credentials("https://h/x?part=2")
    _assert_clean(redact.text(f"GET {u} failed; also 'webhdfs://bob:{PW}@nn:9870/x'"))
    _assert_clean(redact.text(f"https://alice:{PW}@x@h/a"))   # a raw '@' in the password
    assert redact.url("/local/path") == "/local/path"


def test_a_password_in_the_url_is_nowhere(server, tmp_path, monkeypatch, need_fuse):
    base = f"http://alice:{PW}@127.0.0.1:{server.port}"
    url = f"{base}/secure/ckpt"
    node = tmp_path / "node"
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(node / "cache/blobs"),
           "BOOTSEER_STORE_URL": str(tmp_path / "store"),
           "BOOTSEER_TRACE_LOCATION": str(tmp_path / "trace"), "BOOTSEER_TRACE_JOB_ID": "job"}
    mp = tmp_path / "mnt"
    mp.mkdir()
    with open(logs / "mount.log", "wb") as log:
        p = subprocess.Popen([sys.executable, "-m", "bootseer", "-vv", "ckpt", "mount", url,
                              str(mp)], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 30
            while not os.path.ismount(mp):
                assert p.poll() is None and time.time() < deadline, (logs / "mount.log").read_text()
                time.sleep(0.05)
            assert (mp / "model.bin").read_bytes() == DATA
            assert (mp / "meta.json").read_text() == '{"step": 7}'
        finally:
            p.send_signal(signal.SIGTERM)
            assert p.wait(30) == 0
    staging = node / "cache/blobs/ckpt-staging"   # inside the cache dir (cache/blobs)
    profiles = list((staging / "profiles-v1").glob("*.json"))
    assert profiles, "the mount saved no access profile"
    assert list((tmp_path / "store/refs/ckpt/profile").iterdir()), "no profile pushed"
    assert list((tmp_path / "trace/job").rglob("*.jsonl")), "no trace written"
    # item 14: what was fetched with credentials is private
    staged = [f for f in staging.iterdir() if len(f.name) == 32]
    assert staged and {stat.S_IMODE(f.stat().st_mode) for f in staged} == {0o600}
    assert {stat.S_IMODE(f.stat().st_mode) for f in profiles} == {0o600}

    # the next load plans from the pushed profile (another node: an empty staging dir)
    r = subprocess.run([sys.executable, "-m", "bootseer", "-vv", "ckpt", "prefetch", url],
                       env={**env, "BOOTSEER_CACHE_DIR": str(tmp_path / "node2/cache/blobs")},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "access profile" in r.stderr, r.stderr
    (logs / "prefetch.log").write_text(r.stdout + r.stderr)
    # errors, from the command line and from the API
    errors = []
    for argv in (["ckpt", "prefetch", f"{base}/secure/nope/"],
                 ["ckpt", "mount", f"{base}/secure/nope", str(mp)],
                 ["ckpt", "mount", url, str(mp), "--mirror", f"ftp://alice:{PW}@x/"]):
        r = subprocess.run([sys.executable, "-m", "bootseer", "-vv", *argv], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "error" in r.stderr, r.stderr
        errors.append(r.stderr)
    monkeypatch.setenv("BOOTSEER_TRACE_LOCATION", str(tmp_path / "trace"))
    monkeypatch.setenv("BOOTSEER_TRACE_JOB_ID", "job")
    with Engine(CkptConfig(), staging=str(node / "api")) as engine:
        for bad in (f"{url}/nope.bin", f"{url}/nope.bin?X-Amz-Signature={SIG}",
                    f"http://alice:{PW}@127.0.0.1:1/x.bin"):
            with pytest.raises(StoreError) as e:
                bootseer.ckpt.open(bad, engine=engine)
            errors += [str(e.value), repr(e.value), str(e.value.url)]
        presigned = f"{url}/model.bin?X-Amz-Signature={SIG}"
        with bootseer.ckpt.open(presigned, engine=engine) as f:
            assert f.read(10) == DATA[:10]
            errors += [f.name, repr(f), repr(f.reader.source)]
    from bootseer import trace
    with pytest.raises(ValueError), trace.phase("ckpt.custom", url=url, files=[presigned]):
        raise ValueError(f"could not load {presigned}")
    for text in errors:
        _assert_clean(text)
    assert _leaks(tmp_path, skip=("www",)) == []


def test_credentials_from_settings_or_netrc(server, tmp_path, monkeypatch):
    url = f"http://127.0.0.1:{server.port}/secure/ckpt/model.bin"
    with Engine(CkptConfig(), staging=str(tmp_path / "s1")) as engine:
        with pytest.raises(StoreError, match="401"):
            bootseer.ckpt.open(url, engine=engine)
    monkeypatch.setenv("BOOTSEER_CKPT_USERNAME", "alice")
    monkeypatch.setenv("BOOTSEER_CKPT_PASSWORD", PW)
    with Engine(BootseerConfig.from_env().ckpt, staging=str(tmp_path / "s2")) as engine:
        with bootseer.ckpt.open(url, engine=engine) as f:
            assert f.read() == DATA
    monkeypatch.delenv("BOOTSEER_CKPT_USERNAME")
    monkeypatch.delenv("BOOTSEER_CKPT_PASSWORD")
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login alice password {PW}\n")
    os.chmod(netrc, 0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    with Engine(CkptConfig(), staging=str(tmp_path / "s3")) as engine:
        with bootseer.ckpt.open(url, engine=engine) as f:
            assert f.read(100) == DATA[:100]
        staged = [p for p in (tmp_path / "s3").iterdir() if len(p.name) == 32]
        assert {stat.S_IMODE(p.stat().st_mode) for p in staged} == {0o600}


@pytest.mark.parametrize("mode, secure, want", [
    ("auto", True, 0o600), ("auto", False, 0o644), ("private", False, 0o600),
    ("shared", True, 0o644)])
def test_staging_modes(server, tmp_path, mode, secure, want):
    where = f"alice:{PW}@127.0.0.1:{server.port}/secure" if secure else \
        f"127.0.0.1:{server.port}/open"
    old = os.umask(0o022)
    try:
        with Engine(CkptConfig(staging_mode=mode), staging=str(tmp_path / "s")) as engine:
            with bootseer.ckpt.open(f"http://{where}/ckpt/model.bin", engine=engine) as f:
                assert f.read(100) == DATA[:100]
    finally:
        os.umask(old)
    staged = [p for p in (tmp_path / "s").iterdir() if len(p.name) == 32]
    assert staged and {stat.S_IMODE(p.stat().st_mode) for p in staged} == {want}
    if mode == "private":
        assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o700


def test_staging_mode_is_checked():
    with pytest.raises(ValueError, match="ckpt.staging_mode"):
        CkptConfig(staging_mode="world")


def test_oci_credentials_in_the_url_are_used_and_never_shown(registry_factory, tmp_path):
    from bootseer.store import open_store
    from bootseer.store.digest import sha256_digest
    if subprocess.run(["which", "htpasswd"], capture_output=True).returncode:
        pytest.fail("htpasswd missing (apt-get install apache2-utils)")
    users = tmp_path / "htpasswd"
    subprocess.run(["htpasswd", "-Bbc", str(users), "alice", PW], check=True,
                   capture_output=True)
    reg = registry_factory(htpasswd=str(users))
    store = open_store(f"oci://alice:{PW}@127.0.0.1:{reg.port}/p/s",
                       BootseerConfig.from_env({}))
    d = sha256_digest(b"blob")
    assert store.write(d, b"blob") and store.read(d) == b"blob"
    _assert_clean(store.url + repr(store))
    bad = open_store(f"oci://alice:wrong-{PW}@127.0.0.1:{reg.port}/p/s",
                     BootseerConfig.from_env({}))
    with pytest.raises(StoreError) as e:
        bad.read(d)
    _assert_clean(str(e.value))


def test_a_long_error_is_masked_before_it_is_cut(tmp_path, monkeypatch):
    import json

    from bootseer import trace
    monkeypatch.setenv("BOOTSEER_TRACE_LOCATION", str(tmp_path / "trace"))
    monkeypatch.setenv("BOOTSEER_TRACE_JOB_ID", "job")
    head = "x" * (500 - len("ValueError: https://alice:Pw"))   # the cut falls in the password
    with pytest.raises(ValueError), trace.phase("load"):
        raise ValueError(f"{head}https://alice:{PW}@host/ckpt")
    events = [json.loads(line) for p in (tmp_path / "trace").rglob("*.jsonl")
              for line in p.read_text().splitlines()]
    assert events and all("Pw" not in e["attrs"].get("error", "") for e in events)
