"""OpenTelemetry by its conventions: OTLP over HTTP (JSON and protobuf) and gRPC, each
received by a server built from the protocol's own classes (opentelemetry-proto; a real
gRPC server); the standard ``OTEL_*`` environment; a W3C ``traceparent`` joining the
job's own trace; resource attributes by the semantic conventions."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.trace.report_traces import demo_node

pytestmark = pytest.mark.timeout(120)
PARENT_TRACE, PARENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.fixture
def trace(tmp_path):
    for i in range(2):
        demo_node(tmp_path / "t", f"n{i}", rank=i, attempt=0, image_s=4.0,
                  rendezvous_at=9.8).write()
    return tmp_path / "t" / "job"


def _report(*args, env=None):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("OTEL_") and k != "TRACEPARENT"}
    return subprocess.run([sys.executable, "-m", "bootseer", "report", *map(str, args)],
                          capture_output=True, text=True, env={**clean, **(env or {})})


def _spans(req):
    return [(rs, s) for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]


def _attrs(rs) -> dict:
    return {a.key: a.value.string_value or a.value.int_value for a in rs.resource.attributes}


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.requests, self.metadata = [], []

    def Export(self, request, context):
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def grpc_collector():
    collector = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield collector, port
    server.stop(0)


@pytest.fixture
def http_collector():
    got = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            data = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((self.path, self.headers["Content-Type"], dict(self.headers), data))
            body = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield got, server.server_port
    server.shutdown()
    server.server_close()


def test_grpc_with_the_environments_headers(trace, grpc_collector):
    collector, port = grpc_collector
    r = _report(trace, "--otlp", f"grpc://127.0.0.1:{port}",
                env={"OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s3cr%3Dt,x-team=ml"})
    assert r.returncode == 0, r.stderr
    (req,) = collector.requests
    assert collector.metadata[0]["x-api-key"] == "s3cr=t"
    spans = _spans(req)
    assert {s.name for _, s in spans} >= {"startup", "image.lazy"}
    assert {_attrs(rs).get("host.name") for rs, _ in spans} >= {"n0", "n1"}
    assert all(len(s.trace_id) == 16 and len(s.span_id) == 8 for _, s in spans)


def test_the_environment_alone_names_endpoint_and_protocol(trace, http_collector):
    got, port = http_collector
    r = _report(trace, "--otlp", env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                                      "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                      "OTEL_SERVICE_NAME": "train-startup",
                                      "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod"})
    assert r.returncode == 0, r.stderr
    ((path, ctype, _headers, data),) = got
    assert path == "/v1/traces" and ctype == "application/x-protobuf"
    req = trace_service_pb2.ExportTraceServiceRequest.FromString(data)
    for rs, _ in _spans(req):
        a = _attrs(rs)
        assert a["service.name"] == "train-startup" and a["deployment.environment"] == "prod"
        assert "service.version" in a and "bootseer.node" not in a


def test_grpc_protocol_from_the_environment(trace, grpc_collector):
    collector, port = grpc_collector
    r = _report(trace, "--otlp", env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"127.0.0.1:{port}",
                                      "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert r.returncode == 0, r.stderr
    assert len(collector.requests) == 1


def test_a_traceparent_joins_the_jobs_own_trace(trace, tmp_path):
    import json
    out = tmp_path / "spans.json"
    r = _report(trace, "--otlp", out,
                env={"TRACEPARENT": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"})
    assert r.returncode == 0, r.stderr
    spans = [s for rs in json.loads(out.read_text())["resourceSpans"]
             for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert {s["traceId"] for s in spans} == {PARENT_TRACE}
    (root,) = [s for s in spans if s["name"] == "startup"]
    assert root["parentSpanId"] == PARENT_SPAN


@pytest.mark.parametrize("args, env, says", [
    (["--otlp"], {}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    (["--otlp", "x.json", "--traceparent", "00-zz-1-01"], {}, "not a W3C trace context"),
    (["--otlp"], {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                  "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, "is not one of"),
    (["--otlp", "grpc://127.0.0.1:9"], {}, "OTLP receiver grpc://127.0.0.1:9"),
])
def test_bad_telemetry_settings_are_one_line(trace, tmp_path, args, env, says):
    r = _report(trace, *[str(tmp_path / a) if a == "x.json" else a for a in args], env=env)
    assert r.returncode in (1, 2) and says in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("bootseer: error")]) == 1
