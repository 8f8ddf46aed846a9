"""The snapshotter's HTTP endpoint (``--metrics-addr HOST:PORT``): Prometheus metrics and
the probes a kubelet or systemd watchdog asks.

    /metrics   Prometheus text format (below)
    /healthz   200 while the gRPC server runs (liveness: restart the agent when not)
    /readyz    200 once the socket answers and the snapshot records can be read; 503
               before, while stopping, and when the records cannot be read

Metrics carry no per-image or per-job label (a node serves few trees, but their digests
are unbounded over time): totals of the node's agent only.

- ``bootseer_snapshotter_trees_served``: image trees mounted lazily now (gauge);
- ``bootseer_snapshotter_mounts_total{how=started|adopted}``: trees this process mounted,
  and those it took over from a snapshotter before it (their holders lived on);
- ``bootseer_snapshotter_mount_failures_total``: trees that could not be mounted (their
  layers were pulled instead);
- ``bootseer_snapshotter_snapshots{kind=view|active|committed}`` (gauge);
- ``bootseer_snapshotter_errors_total{code}``: calls answered with a gRPC error;
- the image trees' reads, summed over the mounts served now and those ended under this
  process (``tree.session.COUNTERS``): ``_cache_hits_total`` and ``_cache_misses_total``
  (chunks read from the node, and fetched on demand), ``_origin_bytes_total``,
  ``_origin_requests_total``, ``_peer_bytes_total`` (the hot-block prefetch's bytes from
  the job's peers), ``_stall_seconds_total`` (reads waiting on the network),
  ``_read_errors_total`` (failed fetches and prefetch errors).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bootseer.errors import UsageError
from bootseer.snapshotter.metadata import KIND_NAMES
from bootseer.snapshotter.service import SnapshotService

log = logging.getLogger(__name__)
_P = "bootseer_snapshotter_"
_TREE_COUNTERS = (   # counters.json key, metric, help
    ("cache_hits", "cache_hits_total", "Chunks of image trees read from the node."),
    ("cache_misses", "cache_misses_total", "Chunks of image trees fetched on demand."),
    ("origin_bytes", "origin_bytes_total", "Bytes image trees read from the store."),
    ("origin_requests", "origin_requests_total", "Requests image trees made to the store."),
    ("peer_bytes", "peer_bytes_total", "Bytes image trees' prefetch took from peers."),
    ("stall_s", "stall_seconds_total", "Time image tree reads waited on the network."),
    ("errors", "read_errors_total", "Failed fetches and prefetch errors of image trees."),
)


def _num(v: float) -> str:
    return repr(float(v)) if math.isfinite(v) else ("+Inf" if v > 0 else "NaN")


def exposition(service: SnapshotService) -> str:
    """The metrics, in Prometheus text format."""
    lines: list[str] = []

    def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP {_P}{name} {help_}", f"# TYPE {_P}{name} {kind}"])
        lines.extend(f"{_P}{name}{labels} {_num(v)}" for labels, v in samples)

    with service.meta.transaction() as tx:
        snaps = tx.all()
    kinds = dict.fromkeys(KIND_NAMES.values(), 0)
    for s in snaps:
        kinds[KIND_NAMES[s.kind]] += 1
    family("snapshots", "gauge", "Snapshots recorded, by kind.",
           [(f'{{kind="{k}"}}', n) for k, n in kinds.items()])
    family("errors_total", "counter", "Calls answered with a gRPC error, by code.",
           [(f'{{code="{c}"}}', n) for c, n in sorted(service.errors.items())])
    lazy = service.lazy
    if lazy is not None:
        family("trees_served", "gauge", "Image trees mounted lazily now.",
               [("", len(lazy.served()))])
        family("mounts_total", "counter", "Image trees mounted by this process, or adopted "
               "from the one before.", [('{how="started"}', lazy.counts["mounts_started"]),
                                        ('{how="adopted"}', lazy.counts["mounts_adopted"])])
        family("mount_failures_total", "counter", "Image trees that could not be mounted.",
               [("", lazy.counts["mount_failures"])])
        totals = lazy.totals()
        for key, name, help_ in _TREE_COUNTERS:
            family(name, "counter", help_, [("", totals.get(key, 0))])
    return "\n".join(lines) + "\n"


def parse_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (``:PORT`` listens on every address). Raises UsageError."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise UsageError(f"--metrics-addr {addr!r} is not HOST:PORT; "
                         f"hint: --metrics-addr 127.0.0.1:9464")
    return host.strip("[]") or "0.0.0.0", int(port)


class MetricsServer:
    """The endpoint on ``addr``, served from a thread until :meth:`stop`. ``ready`` says
    whether the snapshotter serves (the socket answers, the records can be read)."""

    def __init__(self, addr: str, service: SnapshotService, ready: Callable[[], bool]):
        host, port = parse_addr(addr)
        handler = _handler(service, ready)
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as e:
            raise UsageError(f"cannot listen on {addr} for metrics: {e.strerror}; "
                             f"hint: choose another --metrics-addr") from None
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                        name="bootseer-metrics")

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics and probes on http://%s:%d/", *self.httpd.server_address[:2])
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(service: SnapshotService, ready: Callable[[], bool]) -> type:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    self._send(200, exposition(service),
                               "text/plain; version=0.0.4; charset=utf-8")
                except Exception as e:   # noqa: BLE001 - a scrape never ends the agent
                    self._send(500, f"metrics: {e}\n")
            elif path == "/healthz":
                self._send(200, "ok\n")
            elif path == "/readyz":
                ok = ready()
                self._send(200 if ok else 503, "ready\n" if ok else "not ready\n")
            else:
                self._send(404, "not found: /metrics, /healthz, /readyz\n")

        def _send(self, code: int, body: str, ctype: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass   # scrapes every few seconds: not worth a log line each

    return Handler
