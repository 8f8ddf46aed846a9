"""Property: whatever a server does to each request (another range, a short, long or cut
body, Range ignored, 503s, slowness) and however stripes, retries and hedges to a mirror
interleave, a read gives the file's exact bytes or raises: never other bytes."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bootseer import ckpt
from bootseer.ckpt.engine import Engine
from bootseer.config import CkptConfig, FetchConfig
from bootseer.errors import BootseerError
from tests.security.hostile_server import HostileServer

STRIPE = 16 << 10
DATA = os.urandom(8 * STRIPE + 777)
FAULTS = ["ok", "wrong_start", "short", "long", "cut", "burst_5xx", "ignore_range", "slow"]

scripts = st.lists(st.sampled_from(FAULTS), max_size=12)
reads = st.lists(st.tuples(st.integers(0, len(DATA) - 1), st.integers(1, 3 * STRIPE)),
                 min_size=1, max_size=6)


def _engine() -> Engine:
    return Engine(CkptConfig(stripe_bytes=STRIPE, per_host=3, max_stripes_in_flight=6,
                             hedge_min_s=0.0, hedge_multiple=1.5),
                  FetchConfig(retries=2, backoff_s=0.001, backoff_max_s=0.005))


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(primary=scripts, mirror=st.one_of(st.none(), scripts), wanted=reads)
def test_exact_bytes_or_an_error(primary, mirror, wanted):
    servers = [HostileServer(DATA, "ok", delay_s=0.05, failures=1, script=primary)]
    if mirror is not None:
        servers.append(HostileServer(DATA, "ok", delay_s=0.05, failures=1, script=mirror))
    try:
        with _engine() as eng:
            try:
                f = ckpt.open(f"{servers[0].url}/f", engine=eng,
                              mirrors=[f"{s.url}/f" for s in servers[1:]])
            except BootseerError:
                return
            with f:
                for offset, length in wanted:
                    try:
                        f.seek(offset)
                        got = f.read(length)
                    except (BootseerError, OSError):
                        continue
                    assert got == DATA[offset:offset + length]
    finally:
        for s in servers:
            s.close()
