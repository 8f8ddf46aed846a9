"""Report exports: the Chrome/Perfetto trace, OpenTelemetry spans (file and OTLP/HTTP),
Prometheus metrics, traces read from a URL."""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.trace.report_traces import demo_node

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def _report(*args):
    return subprocess.run([sys.executable, "-m", "bootseer", "report", *map(str, args)],
                          capture_output=True, text=True)


@pytest.fixture
def two_attempts(tmp_path):
    rendezvous = 6.05 + 0.05 + 0.2 + 3.0 + 0.5
    for attempt in (0, 1):
        for i in range(3):
            demo_node(tmp_path / "t", f"n{i}", rank=i, attempt=attempt,
                      image_s=6.0 if i == 2 else 4.0, rendezvous_at=rendezvous).write()
    return tmp_path / "t" / "job"


def test_chrome_export_has_a_named_nested_track_per_pipeline(two_attempts, tmp_path):
    r = _report(two_attempts, "--chrome", tmp_path / "c.json")
    assert r.returncode == 0, r.stderr
    evs = json.loads((tmp_path / "c.json").read_text())["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in evs if e["name"] == "process_name"}
    slices = [e for e in evs if e["ph"] == "X"]
    assert all((e["pid"], e["tid"]) in threads for e in slices)
    n0 = next(p for p, name in procs.items() if name == "n0 (attempt 0)")
    names = {name for (pid, _), name in threads.items() if pid == n0}
    assert {"image", "deps", "deps (2)", "startup", "job rank 0", "ckpt rank 0"} <= names
    # the launcher's pipelines are threads of one process: each its own track
    by_track = {}
    for e in slices:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for track in by_track.values():    # every pair of slices on a track nests or is disjoint
        track.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []
        for e in track:
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            assert not open_ends or e["ts"] + e["dur"] <= open_ends[-1], e["name"]
            open_ends.append(e["ts"] + e["dur"])
    instants = {e["name"] for e in evs if e["ph"] == "i"}
    assert {"ready", "rendezvous", "image.window"} <= instants
    counters = {e["name"] for e in evs if e["ph"] == "C"}
    assert {"ckpt MB/s", "stalls (s, cumulative)"} <= counters
    # absolute microseconds: the restart comes after the first start on one timeline
    first = {a: min(e["ts"] for e in slices if e["pid"] // 100000 == a) for a in (0, 1)}
    assert first[0] > 1.6e15 and first[1] - first[0] == pytest.approx(1000e6, abs=1e3)
    path = [e["name"] for e in slices if e["pid"] == 0]
    assert path[0] == "image.lazy" and "train.first_step" in path


@pytest.mark.slow
def test_otlp_json_file_and_a_receiver(two_attempts, tmp_path):
    r = _report(two_attempts, "--otlp", tmp_path / "spans.json")
    assert r.returncode == 0, r.stderr
    body = json.loads((tmp_path / "spans.json").read_text())
    _check_otlp(body)

    received, auth, decoded = [], [], []

    class Receiver(http.server.BaseHTTPRequestHandler):
        """An OTLP/HTTP JSON receiver built from the protocol's own classes
        (opentelemetry-proto), decoding as the collector does."""

        def do_POST(self):
            data = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers["Content-Type"], json.loads(data)))
            auth.append(self.headers.get("Authorization"))
            decoded.append(_otlp_decode(data))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(_otlp_response())

        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://user:s3cret@127.0.0.1:{server.server_port}"
        r = _report(two_attempts, "--otlp", url)
        assert r.returncode == 0, r.stderr
        ((path, ctype, sent),) = received
        assert path == "/v1/traces" and ctype == "application/json" and sent == body
        _check_otlp_proto(decoded[0], body)
        assert auth == ["Basic dXNlcjpzM2NyZXQ="]      # user:s3cret, as a header
        r = _report(two_attempts, "--otlp", url.replace(str(server.server_port), "9"))
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "OTLP" in r.stderr
        assert "s3cret" not in r.stderr
    finally:
        server.shutdown()


_OTLP_IDS = ("traceId", "spanId", "parentSpanId")


def _otlp_decode(data: bytes):
    """The request as an ``ExportTraceServiceRequest``. OTLP/JSON is proto3's JSON mapping
    but for ids, which are hex, not base64 (the collector's decoder does this too); any
    other departure (an unknown field, a wrong type) fails ``ParseDict``."""
    import base64

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    def ids_as_base64(x):
        if isinstance(x, dict):
            return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in _OTLP_IDS and v
                    else ids_as_base64(v) for k, v in x.items()}
        return [ids_as_base64(v) for v in x] if isinstance(x, list) else x
    return json_format.ParseDict(ids_as_base64(json.loads(data)), ExportTraceServiceRequest())


def _otlp_response() -> bytes:
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
    return json_format.MessageToJson(ExportTraceServiceResponse()).encode()


def _check_otlp_proto(req, body: dict) -> None:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
    spans = [(rs, s) for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(spans) == sum(len(ss["spans"]) for rs in body["resourceSpans"]
                             for ss in rs["scopeSpans"])
    ids = {s.span_id for _, s in spans}
    for rs, s in spans:
        assert len(s.trace_id) == 16 and len(s.span_id) == 8
        assert not s.parent_span_id or s.parent_span_id in ids
        assert s.kind == Span.SPAN_KIND_INTERNAL and s.end_time_unix_nano >= s.start_time_unix_nano
        assert s.status.code in (Status.STATUS_CODE_UNSET, Status.STATUS_CODE_OK,
                                 Status.STATUS_CODE_ERROR)
        assert {"bootseer.job", "bootseer.attempt"} <= {a.key for a in rs.resource.attributes}
    nodes = {a.value.string_value for rs in req.resource_spans for a in rs.resource.attributes
             if a.key == "host.name"}
    assert nodes == {"n0", "n1", "n2"}
    assert {s.name for _, s in spans} >= {"startup", "image.lazy", "ckpt.load"}


def _check_otlp(body: dict) -> None:
    spans, resources = {}, []
    for rs in body["resourceSpans"]:
        attrs = {a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}
        resources.append(attrs)
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                assert re.fullmatch(r"[0-9a-f]{32}", s["traceId"])
                assert re.fullmatch(r"[0-9a-f]{16}", s["spanId"])
                assert int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"])
                spans[s["spanId"]] = (s, attrs)
    assert len({s["traceId"] for s, _ in spans.values()}) == 2     # one trace per attempt
    for s, _ in spans.values():    # every parent exists, in the same trace
        if s.get("parentSpanId"):
            assert spans[s["parentSpanId"]][0]["traceId"] == s["traceId"]
    ranked = [a for a in resources if "bootseer.rank" in a]
    assert {a["host.name"] for a in ranked} == {"n0", "n1", "n2"}
    assert all(a["service.name"] == "bootseer" and "service.version" in a for a in resources)
    assert {a["bootseer.attempt"] for a in resources} == {"0", "1"}
    by_name = {}
    for s, attrs in spans.values():
        by_name.setdefault(s["name"], []).append((s, attrs))
    numpy = by_name["import.numpy"][0][0]
    assert spans[numpy["parentSpanId"]][0]["name"] == "import.torch"
    node_span = spans[by_name["image.lazy"][0][0]["parentSpanId"]][0]
    assert node_span["name"].startswith("node ") and \
        {"ready", "rendezvous"} <= {e["name"] for e in node_span["events"]}


def _prom_families(text: str) -> dict:
    """The textfile as Prometheus reads it: prometheus_client's parser (the exposition
    format's reference implementation) raises on a malformed line."""
    from prometheus_client.parser import text_string_to_metric_families
    families = {}
    for f in text_string_to_metric_families(text):
        assert f.name not in families, f.name      # one block per metric
        families[f.name] = f
    return families


def test_prometheus_textfile(two_attempts, tmp_path):
    r = _report(two_attempts, "--prom", tmp_path / "startup.prom")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "startup.prom").read_text()
    families = _prom_families(text)
    declared = {name: f.type for name, f in families.items()}
    seen = [s for f in families.values() for s in f.samples]
    assert len(seen) == len([x for x in text.splitlines() if not x.startswith("#")])
    assert declared["bootseer_startup_node_ready_seconds"] == "histogram"
    buckets = [x.value for x in seen if x.name == "bootseer_startup_node_ready_seconds_bucket"
               and x.labels["attempt"] == "0" and x.labels["gpus_bin"] == "10-100"]
    assert buckets == sorted(buckets) and buckets[-1] == 3.0       # cumulative; +Inf = count
    # node metrics: cache hit ratio, prefetch coverage, bytes from store and peers, stalls
    node = {(x.name, x.labels.get("source") or x.labels.get("technique"),
             x.labels.get("pipeline")): x.value
            for x in seen if x.name.startswith("bootseer_node_")
            and x.labels["attempt"] == "1" and x.labels["node"] == "n2"}
    assert node == {("bootseer_node_cache_hit_ratio", None, None): 0.25,
                    ("bootseer_node_prefetch_coverage", None, None): 0.97,
                    ("bootseer_node_fetched_bytes", "origin", "image"): 120e6,
                    ("bootseer_node_fetched_bytes", "peers", "image"): 80e6,
                    ("bootseer_node_stall_seconds", "image", None): 0.2,
                    ("bootseer_node_stall_seconds", "ckpt", None): 0.1}
    assert re.search(r'bootseer_startup_critical_path_seconds\{job_id="job",attempt="0",'
                     r'gpus_bin="10-100",pipeline="image"\} 5\.99', text)
    assert re.search(r'bootseer_startup_technique_ratio\{job_id="job",attempt="1",'
                     r'gpus_bin="10-100",technique="image",figure="coverage"\} 0\.97', text)
    # one unit per family: no family mixes a ratio with seconds or bytes
    assert declared["bootseer_startup_phase_seconds"] == "summary"
    quantiles = {x.labels["quantile"] for x in seen
                 if x.name == "bootseer_startup_phase_seconds"}
    assert quantiles == {"0.5", "0.9", "1"}
    assert any(x.name == "bootseer_startup_phase_seconds_count" for x in seen)
    assert not any("stat" in x.labels for x in seen)
    assert "bootseer_startup_technique" not in declared
    assert 'bootseer_startup_restarts{job_id="job"} 1.0' in text
    # the dashboard in deploy/ asks only for metrics and labels the export has
    dash = json.loads((ROOT / "deploy" / "grafana" / "bootseer-startup.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs.append(dash["templating"]["list"][1]["query"])
    metrics = set(re.findall(r"^(\w+?)(?:\{| )", text, re.M))
    labels = set(re.findall(r'(\w+)="', text))
    for expr in exprs:
        for name in re.findall(r"\bbootseer_\w+", expr):
            assert name in metrics, name
        for label in re.findall(r"(\w+)=~?\"", expr) + re.findall(r"by \(([\w, ]+)\)", expr):
            assert set(label.replace(" ", "").split(",")) <= labels, (label, expr)


def test_prometheus_bytes_by_source_per_node_and_pipeline(tmp_path):
    """Origin and peer bytes per node for each pipeline that traced them; a source not
    traced (a start without peers) has no sample, not a zero."""
    from tests.trace.test_report_sources import MiB, _node, _peers_job
    _peers_job(tmp_path / "t", attempt=0)
    _node(tmp_path / "t", "n0", attempt=1, image={"store_bytes": 64 * MiB},
          ckpt=[{"bytes_fetched": 100 * MiB}])
    r = _report(tmp_path / "t" / "job", "--prom", tmp_path / "startup.prom")
    assert r.returncode == 0, r.stderr
    families = _prom_families((tmp_path / "startup.prom").read_text())
    fetched = {(x.labels["attempt"], x.labels["node"], x.labels["pipeline"],
                x.labels["source"]): x.value
               for x in families["bootseer_node_fetched_bytes"].samples}
    assert fetched[("0", "n0", "image", "origin")] == 66 * MiB
    assert fetched[("0", "n0", "image", "peers")] == 0
    assert fetched[("0", "n1", "deps", "peers")] == 40 * MiB
    assert fetched[("0", "n2", "deps", "origin")] == 3 * MiB
    assert fetched[("0", "n1", "ckpt", "peers")] == 200 * MiB
    assert len([k for k in fetched if k[0] == "0"]) == 3 * 3 * 2
    assert {k[2:]: v for k, v in fetched.items() if k[0] == "1"} == {
        ("image", "origin"): 64 * MiB, ("ckpt", "origin"): 100 * MiB}


@pytest.mark.slow
def test_trace_from_a_url(two_attempts, tmp_path):
    r = _report(f"file://{two_attempts}")
    assert r.returncode == 0, r.stderr
    assert "attempt 1: 3 nodes" in r.stdout
    r = _report("memory://nowhere/job")
    assert r.returncode == 1 and "holds no trace files" in r.stderr


@pytest.mark.slow
def test_a_url_as_trace_location_is_never_a_local_directory(tmp_path):
    """Recording appends to local files: ``--trace s3://bucket/t`` used to create ./s3:.
    bootseer run uploads to a store it can write (tests/trace/test_remote.py), else fails."""
    r = subprocess.run([sys.executable, "-m", "bootseer", "run", "--trace",
                        "http://user:pw@127.0.0.1:9/t", "--", "true"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0 and r.stderr.count("\n") == 1
    assert "cannot record traces" in r.stderr and "pw" not in r.stderr
    code = "from bootseer import trace\nwith trace.phase('x'):\n    trace.mark('ready')\n"
    env = {**__import__("os").environ, "BOOTSEER_TRACE_LOCATION": "s3://bucket/t"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, env=env)
    assert r.returncode == 0 and "not tracing" in r.stderr    # the job runs, untraced
    assert list(tmp_path.iterdir()) == []
