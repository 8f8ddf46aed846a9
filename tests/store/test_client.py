"""The process's store client: one per configuration, one fetcher per fetch settings, a
fresh one in a forked child; the helpers the OCI backend leaves policy to."""

from __future__ import annotations

import multiprocessing

import pytest

from bootseer.config import BootseerConfig, CacheConfig, FetchConfig, StoreConfig
from bootseer.errors import FetchError
from bootseer.store.claim import claim_by_read_back
from bootseer.store.client import StoreClient, process_fetcher
from bootseer.store.retry import retry


def _config(tmp_path, **fetch) -> BootseerConfig:
    return BootseerConfig(store=StoreConfig(url=str(tmp_path / "store")),
                          cache=CacheConfig(dir=str(tmp_path / "cache")),
                          fetch=FetchConfig(**fetch))


def test_one_client_and_one_fetcher_per_process(tmp_path):
    config = _config(tmp_path, retries=3)
    c = StoreClient.of(config)
    assert StoreClient.of(_config(tmp_path, retries=3)) is c     # equal settings, same one
    assert c.fetcher is process_fetcher(FetchConfig(retries=3))
    assert c.store() is c.store(str(tmp_path / "store"))
    assert c.cache is c.cache and c.cache.root == tmp_path / "cache"
    other = StoreClient.of(_config(tmp_path / "other", retries=3))
    assert other is not c and other.fetcher is c.fetcher        # one queue for both
    with c.lane() as a, other.lane() as b:
        assert a.fetcher is b.fetcher is c.fetcher and a is not b


def _child(config, parent_fetcher_id, out):
    out.put(id(StoreClient.of(config).fetcher) != parent_fetcher_id)


def test_a_forked_child_makes_its_own(tmp_path):
    config = _config(tmp_path, retries=4)
    parent = StoreClient.of(config)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_child, args=(config, id(parent.fetcher), out))
    p.start()
    assert out.get(timeout=20) is True
    p.join(20)
    assert p.exitcode == 0


def test_retry_repeats_only_transient_errors():
    calls, pauses = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise FetchError("BLOB_UNKNOWN")
        return "done"
    assert retry(flaky, attempts=5, pause_s=0.1, sleep=pauses.append,
                 transient=lambda e: "BLOB_UNKNOWN" in str(e)) == "done"
    assert pauses == [0.1, 0.2]
    with pytest.raises(FetchError, match="denied"):
        retry(lambda: (_ for _ in ()).throw(FetchError("denied")), attempts=5, pause_s=0,
              transient=lambda e: "BLOB_UNKNOWN" in str(e))
    calls.clear()
    with pytest.raises(FetchError, match="BLOB_UNKNOWN"):
        retry(lambda: flaky() and flaky() and flaky(), attempts=1, pause_s=0,
              transient=lambda e: True)


def test_claim_by_read_back_has_one_winner():
    refs: dict[str, str] = {}
    slept = []

    def racing_put(name, digest):   # another contender's put lands after ours
        refs[name] = digest
        refs[name] = "sha256:other"
    assert claim_by_read_back(refs.get, racing_put, "lease", "sha256:mine",
                              sleep=slept.append) is False
    assert slept == [1.0]
    assert claim_by_read_back(refs.get, refs.__setitem__, "lease", "sha256:x",
                              sleep=slept.append) is False      # taken: no put, no wait
    assert len(slept) == 1
    assert claim_by_read_back(refs.get, refs.__setitem__, "free", "sha256:mine",
                              settle_s=0.01) is True
