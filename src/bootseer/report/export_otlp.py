"""OpenTelemetry export: a job's trace as OTLP spans (``ExportTraceServiceRequest``).

Where they go follows OpenTelemetry's own conventions: a file (OTLP/JSON), an OTLP/HTTP
receiver (``http(s)://collector:4318``, ``/v1/traces`` added when the URL has no path), an
OTLP/gRPC one (``grpc://collector:4317``, or ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``), or, with
no URL given, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` with
``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`` and ``_PROTOCOL`` (``http/json``, the default,
``http/protobuf`` or ``grpc``; the last two need the ``otlp`` extra: opentelemetry-proto,
and grpcio for gRPC). HTTP goes through ``HTTPS_PROXY``/``NO_PROXY`` as the standard library
does.

One trace per attempt (its id derived from job and attempt, so a re-export is the same
trace), unless a W3C ``traceparent`` (``--traceparent`` or ``TRACEPARENT``) names the
job's own trace: then each attempt's ``startup`` span is a child of that span. Resources
follow the semantic conventions: ``service.name`` (``OTEL_SERVICE_NAME``, else
``bootseer``), ``service.version``, ``host.name`` (the node), ``process.pid``, plus
``OTEL_RESOURCE_ATTRIBUTES``; what has no convention stays ``bootseer.job``,
``bootseer.attempt``, ``bootseer.rank``. A root span ``startup`` per attempt (first event to
time to ready), a ``node`` span per node under it, each phase under its enclosing phase (or
its node); marks are span events on their node span.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

from bootseer import __version__
from bootseer.errors import TraceError, UsageError
from bootseer.report.summary import Summary
from bootseer.report.views import AttemptView

SCOPE = {"name": "bootseer.trace", "version": "1"}
STATUS_ERROR = 2
KIND_INTERNAL = 1


def _id(n_hex: int, *parts) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:n_hex]


def _ns(t: float) -> str:
    return str(int(round(t * 1e9)))


def _value(v) -> dict:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": str(v)}


def _attrs(d: dict) -> list[dict]:
    return [{"key": k, "value": _value(v)} for k, v in d.items() if v is not None
            and isinstance(v, (str, int, float, bool))]


_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True)
class Parent:
    """A W3C trace context the job's spans join."""
    trace_id: str
    span_id: str


def parse_traceparent(value: str) -> Parent:
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None or m.group(1) == "ff" or set(m.group(2)) == {"0"} or set(m.group(3)) == {"0"}:
        raise UsageError(f"traceparent {value!r} is not a W3C trace context "
                         "(00-<32 hex trace id>-<16 hex span id>-<2 hex flags>)")
    return Parent(m.group(2), m.group(3))


def resource_attributes(env: Mapping[str, str]) -> dict:
    """The resource attributes every resource gets: ``service.*`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k2=v2``, values percent-decoded)."""
    out = {}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        k, eq, v = item.partition("=")
        if eq and k.strip():
            out[k.strip()] = urllib.parse.unquote(v.strip())
    out["service.name"] = env.get("OTEL_SERVICE_NAME") or out.get("service.name", "bootseer")
    out.setdefault("service.version", __version__)
    return out


def request(job: str, views: list[AttemptView], summaries: list[Summary], *,
            parent: Parent | None = None, resource: Mapping | None = None) -> dict:
    resource_spans = []
    sums = {s.attempt: s for s in summaries}
    base = dict(resource or {"service.name": "bootseer", "service.version": __version__})
    for v in views:
        trace_id = parent.trace_id if parent else _id(32, job, v.attempt)
        root_id = _id(16, job, v.attempt, "startup")
        s = sums.get(v.attempt)
        end = s.time_to_ready if s and s.time_to_ready is not None else max(
            [x["end"] for n in v.nodes for x in n.spans] + [0.0])
        root = {"traceId": trace_id, "spanId": root_id, "name": "startup",
                "kind": KIND_INTERNAL, "startTimeUnixNano": _ns(v.t0),
                "endTimeUnixNano": _ns(v.t0 + end),
                "attributes": _attrs({"bootseer.nodes": len(v.nodes),
                                      "bootseer.gating_node": s.gating_node if s else None,
                                      "bootseer.gating_phase": s.gating_phase if s else None,
                                      "bootseer.time_to_ready_s": s.time_to_ready if s else None}),
                "status": {} if s and s.time_to_ready is not None else {"code": STATUS_ERROR,
                                                                         "message": "not ready"}}
        if parent:
            root["parentSpanId"] = parent.span_id
        resource_spans.append(_resource({**base, "bootseer.job": job,
                                         "bootseer.attempt": v.attempt}, [root]))
        for n in v.nodes:
            resource_spans += _node(job, v, n, trace_id, root_id, base)
    return {"resourceSpans": resource_spans}


def _resource(attrs: dict, spans: list[dict]) -> dict:
    return {"resource": {"attributes": _attrs(attrs)},
            "scopeSpans": [{"scope": SCOPE, "spans": spans}]}


def _node(job: str, v: AttemptView, n, trace_id: str, root_id: str, base: dict
          ) -> list[dict]:
    node_id = _id(16, job, v.attempt, n.node)
    end = max([x["end"] for x in n.spans] + [m["t"] for m in n.marks] + [n.start])
    node_span = {"traceId": trace_id, "spanId": node_id, "parentSpanId": root_id,
                 "name": f"node {n.node}", "kind": KIND_INTERNAL,
                 "startTimeUnixNano": _ns(v.t0 + n.start), "endTimeUnixNano": _ns(v.t0 + end),
                 "attributes": _attrs({"bootseer.ready_s": n.ready, "bootseer.gpus": n.gpus}),
                 "events": [{"timeUnixNano": _ns(v.t0 + m["t"]), "name": m["phase"],
                             "attributes": _attrs({**m["attrs"], "bootseer.lane": m["lane"],
                                                   "bootseer.rank": m["rank"]})}
                            for m in n.marks],
                 "status": {}}
    by_proc: dict = {}
    for x in n.spans:
        by_proc.setdefault((x["pid"], x["rank"]), []).append(x)
    node_attrs = {**base, "host.name": n.node, "bootseer.job": job,
                  "bootseer.attempt": v.attempt}
    out = [_resource(node_attrs, [node_span])]
    for (pid, rank), spans in sorted(by_proc.items(), key=lambda kv: str(kv[0])):
        items = []
        # a span's parent: the innermost enclosing span of its lane and track
        open_: dict[tuple, list[tuple[float, str]]] = {}
        for x in sorted(spans, key=lambda x: (x["start"], -x["end"])):
            span_id = _id(16, job, v.attempt, n.node, pid, x["phase"], x["start"], x["lane"])
            stack = open_.setdefault((x["lane"], x["track"]), [])
            while stack and stack[-1][0] <= x["start"]:
                stack.pop()
            parent = stack[-1][1] if stack and x["parent"] else node_id
            stack.append((x["end"], span_id))
            items.append({"traceId": trace_id, "spanId": span_id, "parentSpanId": parent,
                          "name": x["phase"], "kind": KIND_INTERNAL,
                          "startTimeUnixNano": _ns(v.t0 + x["start"]),
                          "endTimeUnixNano": _ns(v.t0 + x["end"]),
                          "attributes": _attrs({**x["attrs"], "bootseer.lane": x["lane"]}),
                          "status": {"code": STATUS_ERROR, "message": str(
                              x["attrs"].get("error", "failed"))[:200]}
                          if x["status"] == "failed" else {}})
        out.append(_resource({**node_attrs, "bootseer.rank": rank, "process.pid": pid}, items))
    return out


def to_json(job: str, views: list[AttemptView], summaries: list[Summary], *,
            parent: Parent | None = None, resource: Mapping | None = None) -> str:
    return json.dumps(request(job, views, summaries, parent=parent, resource=resource))


PROTOCOLS = ("http/json", "http/protobuf", "grpc")


@dataclass(frozen=True)
class Target:
    """Where spans are sent, and how."""
    endpoint: str
    protocol: str = "http/json"
    headers: dict = field(default_factory=dict)


def is_url(value: str) -> bool:
    return value.startswith(("http://", "https://", "grpc://", "grpcs://"))


def target(url: str | None, env: Mapping[str, str]) -> Target:
    """The receiver from ``--otlp URL`` (or, when ``url`` is empty, the environment's
    ``OTEL_EXPORTER_OTLP_*``) with the environment's headers and protocol."""
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/json").strip().lower()
    if protocol not in PROTOCOLS:
        raise UsageError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not one of "
                         f"{', '.join(PROTOCOLS)}")
    headers = _headers(env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
                       or env.get("OTEL_EXPORTER_OTLP_HEADERS") or "")
    if url:
        endpoint = url
    elif env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):   # used as it is
        endpoint = env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    elif env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):   # the base: the signal's path added
        endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"]
        if protocol != "grpc":
            endpoint = endpoint.rstrip("/") + "/v1/traces"
    else:
        raise UsageError("--otlp without a URL sends to OTEL_EXPORTER_OTLP_ENDPOINT (or "
                         "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), and neither is set; hint: give "
                         "--otlp http://collector:4318 or set the variable")
    if endpoint.startswith(("grpc://", "grpcs://")):
        protocol = "grpc"
    elif protocol == "grpc" and not endpoint.startswith(("http://", "https://")):
        endpoint = "grpc://" + endpoint
    return Target(endpoint, protocol, headers)


def _headers(value: str) -> dict:
    out = {}
    for item in value.split(","):
        k, eq, v = item.partition("=")
        if eq and k.strip():
            out[k.strip()] = urllib.parse.unquote(v.strip())
    return out


def send(to: Target, body: str, timeout_s: float = 30.0) -> None:
    """Send the spans (``body``: OTLP/JSON) to ``to``. A refusal is one line, never a
    traceback; credentials never appear in it."""
    if to.protocol == "grpc":
        return _send_grpc(to, body, timeout_s)
    url = to.endpoint
    if url.rstrip("/").count("/") <= 2:
        url = url.rstrip("/") + "/v1/traces"
    shown = _without_credentials(url)
    headers = {**to.headers}
    if to.protocol == "http/protobuf":
        data = _proto(body).SerializeToString()
        headers["Content-Type"] = "application/x-protobuf"
    else:
        data = body.encode()
        headers["Content-Type"] = "application/json"
    parts = urllib.parse.urlsplit(url)
    if parts.username is not None:   # user:password@ becomes basic auth, never a host name
        token = base64.b64encode(f"{urllib.parse.unquote(parts.username)}:"
                                 f"{urllib.parse.unquote(parts.password or '')}".encode())
        headers["Authorization"] = f"Basic {token.decode()}"
    req = urllib.request.Request(shown, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            r.read()
    except urllib.error.HTTPError as e:
        raise TraceError(f"OTLP receiver {shown} refused the spans: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TraceError(f"cannot send spans to OTLP receiver {shown}: {reason}") from None


def post(url: str, body: str, timeout_s: float = 30.0) -> None:
    """OTLP/HTTP JSON to ``url`` (``/v1/traces`` added when the URL has no path)."""
    send(Target(url), body, timeout_s)


_IDS = ("traceId", "spanId", "parentSpanId")


def _proto(body: str):
    """The spans as the protocol's own message (opentelemetry-proto). OTLP/JSON is proto3's
    JSON mapping but for ids, which are hex there and base64 in proto3 JSON."""
    try:
        from google.protobuf import json_format
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )
    except ImportError:
        raise UsageError("OTLP over protobuf or gRPC needs the otlp extra (pip install "
                         "'bootseer[otlp]'); hint: OTEL_EXPORTER_OTLP_PROTOCOL=http/json "
                         "needs nothing") from None

    def ids_as_base64(x):
        if isinstance(x, dict):
            return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in _IDS and v
                    else ids_as_base64(v) for k, v in x.items()}
        return [ids_as_base64(v) for v in x] if isinstance(x, list) else x
    return json_format.ParseDict(ids_as_base64(json.loads(body)), ExportTraceServiceRequest())


def _send_grpc(to: Target, body: str, timeout_s: float) -> None:
    message = _proto(body)
    try:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
    except ImportError:
        raise UsageError("OTLP over gRPC needs grpcio (pip install 'bootseer[otlp]')") from None
    parts = urllib.parse.urlsplit(to.endpoint)
    secure = parts.scheme in ("grpcs", "https")
    host = parts.netloc.rsplit("@", 1)[-1]
    shown = f"{parts.scheme}://{host}"
    channel = (grpc.secure_channel(host, grpc.ssl_channel_credentials()) if secure
               else grpc.insecure_channel(host))
    metadata = [(k.lower(), v) for k, v in to.headers.items()]
    try:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        stub.Export(message, timeout=timeout_s, metadata=metadata or None)
    except grpc.RpcError as e:
        raise TraceError(f"OTLP receiver {shown} refused the spans: {e.code().name} "
                         f"{e.details() or ''}".rstrip()) from None
    finally:
        channel.close()


def _without_credentials(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=host))
