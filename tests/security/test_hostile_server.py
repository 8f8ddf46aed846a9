"""Every reader of remote bytes against a server that misbehaves (tests/security/
hostile_server.py): the checkpoint engine (mount, ``bootseer.ckpt.open``), the store's
HTTP backend and its range client (the OCI backend's and the peers' origin reads go
through the same client). The right bytes or an error, never other bytes."""

from __future__ import annotations

import io
import os

import pytest

from bootseer import ckpt
from bootseer.ckpt.engine import Engine
from bootseer.ckpt.source import HttpFileSource
from bootseer.config import CkptConfig, FetchConfig
from bootseer.errors import BootseerError, FetchError, StoreError, WrongRange
from bootseer.store import http
from bootseer.store.backends.http import HttpBackend
from bootseer.store.digest import sha256_digest
from tests.security.hostile_server import HostileServer

STRIPE = 64 << 10
DATA = os.urandom(16 * STRIPE + 1234)


def engine() -> Engine:
    return Engine(CkptConfig(stripe_bytes=STRIPE, per_host=4, max_stripes_in_flight=8),
                  FetchConfig(retries=2, backoff_s=0.01, backoff_max_s=0.02))


def read_all(url: str, eng: Engine) -> bytes:
    with ckpt.open(f"{url}/f", engine=eng) as f:
        return io.BufferedReader(f, 1 << 20).read()


def test_a_correct_server_gives_the_file():
    with HostileServer(DATA) as s, engine() as eng:
        assert read_all(s.url, eng) == DATA


def test_a_206_for_another_range_is_refused_naming_the_answer():
    with HostileServer(DATA, "wrong_start") as s:
        src = HttpFileSource(f"{s.url}/f", len(DATA))
        with pytest.raises(WrongRange, match=r"asked for bytes 65536-131071.*"
                                             r"Content-Range 'bytes 0-65535/"):
            src.read_range(STRIPE, 2 * STRIPE)
        with engine() as eng, pytest.raises(StoreError):
            with ckpt.open(f"{s.url}/f", engine=eng) as f:
                f.seek(STRIPE)
                f.read(STRIPE)


@pytest.mark.parametrize("mode", ["short", "long", "cut"])
def test_a_body_of_the_wrong_length_is_an_error(mode):
    with HostileServer(DATA, mode) as s:
        src = HttpFileSource(f"{s.url}/f", len(DATA))
        with pytest.raises(StoreError):
            src.read_range(STRIPE, 2 * STRIPE)


def test_a_server_ignoring_range_is_read_as_one_stream(caplog):
    """Detected at its first 200 for a sub-range, said once; the file is then read in one
    pass: beyond the first requests in flight (each answered with the whole body before
    the first answer is seen), about the file once, not a whole body per stripe (17)."""
    eng = Engine(CkptConfig(stripe_bytes=STRIPE, per_host=2, max_stripes_in_flight=2))
    with HostileServer(DATA, "ignore_range") as s, eng:
        assert read_all(s.url, eng) == DATA
        assert s.bytes_sent <= 4 * len(DATA), s.bytes_sent
    said = [r for r in caplog.records if "ignores Range" in r.getMessage()]
    assert len(said) == 1


def test_a_server_ignoring_range_serves_random_reads_right():
    with HostileServer(DATA, "ignore_range") as s:
        src = HttpFileSource(f"{s.url}/f", len(DATA))
        for a, b in [(5 * STRIPE, 5 * STRIPE + 100), (7, 70000), (len(DATA) - 10, len(DATA)),
                     (3 * STRIPE, 4 * STRIPE)]:
            assert src.read_range(a, b) == DATA[a:b]
        assert src.ranges_ignored


def test_an_etag_changing_mid_read_is_file_changed():
    with HostileServer(DATA, "etag_flip") as s:
        src = HttpFileSource(f"{s.url}/f", len(DATA))
        src.read_range(0, STRIPE)
        with pytest.raises(StoreError, match="changed during the read"):
            src.read_range(STRIPE, 2 * STRIPE)


def test_a_burst_of_5xx_is_retried_then_read():
    with HostileServer(DATA, "burst_5xx", failures=2) as s, engine() as eng:
        assert read_all(s.url, eng) == DATA


def test_the_store_range_client_refuses_another_range():
    with HostileServer(DATA, "wrong_start") as s:
        with pytest.raises(WrongRange):
            http.get_range(f"{s.url}/f", 100, 200)
        buf = bytearray(100)
        with pytest.raises(WrongRange):
            http.get_range_into(f"{s.url}/f", 100, buf)
        s.mode = "ignore_range"
        assert http.get_range(f"{s.url}/f", 100, 200) == DATA[100:200]
        s.mode = "ok"
        assert http.get_range(f"{s.url}/f", 100, 200) == DATA[100:200]


def test_the_http_store_backend_refuses_another_range():
    digest = sha256_digest(DATA)
    path = f"/blobs/sha256/{digest.split(':')[1][:2]}/{digest.split(':')[1]}"
    with HostileServer(DATA, "wrong_start", files={path: DATA}) as s:
        backend = HttpBackend(s.url)
        with pytest.raises(WrongRange):
            backend.read(digest, 1000, 2000)
        s.mode = "ok"
        assert backend.read(digest, 1000, 2000) == DATA[1000:2000]


def test_a_timeout_setting_applies_to_checkpoint_reads(monkeypatch):
    monkeypatch.setenv("BOOTSEER_FETCH_TIMEOUT_S", "0.2")
    with HostileServer(DATA, "slow", delay_s=1.0) as s:
        src = HttpFileSource(f"{s.url}/f", len(DATA))
        assert src.timeout == 0.2
        with pytest.raises((FetchError, OSError, BootseerError)):
            src.read_range(0, 100)
