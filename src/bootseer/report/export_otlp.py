"""OpenTelemetry export: a job's trace as OTLP/JSON spans (``ExportTraceServiceRequest``,
the body an OTLP/HTTP receiver takes at ``/v1/traces``), with the standard library only.

One trace per attempt (its id derived from job and attempt, so a re-export is the same
trace); one resource per node and process, with attributes ``bootseer.job``,
``bootseer.attempt``, ``bootseer.node``, ``bootseer.rank``; a root span ``startup`` per
attempt (first event to time to ready), a ``node`` span per node under it, each phase under
its enclosing phase (or its node); marks are span events on their node span.
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request

from bootseer.errors import TraceError
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


def request(job: str, views: list[AttemptView], summaries: list[Summary]) -> dict:
    resource_spans = []
    sums = {s.attempt: s for s in summaries}
    for v in views:
        trace_id = _id(32, job, v.attempt)
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
        resource_spans.append(_resource({"bootseer.job": job, "bootseer.attempt": v.attempt},
                                        [root]))
        for n in v.nodes:
            resource_spans += _node(job, v, n, trace_id, root_id)
    return {"resourceSpans": resource_spans}


def _resource(attrs: dict, spans: list[dict]) -> dict:
    return {"resource": {"attributes": _attrs({"service.name": "bootseer", **attrs})},
            "scopeSpans": [{"scope": SCOPE, "spans": spans}]}


def _node(job: str, v: AttemptView, n, trace_id: str, root_id: str) -> list[dict]:
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
    out = [_resource({"bootseer.job": job, "bootseer.attempt": v.attempt,
                      "bootseer.node": n.node}, [node_span])]
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
        attrs = {"bootseer.job": job, "bootseer.attempt": v.attempt, "bootseer.node": n.node,
                 "bootseer.rank": rank, "process.pid": pid}
        out.append(_resource(attrs, items))
    return out


def to_json(job: str, views: list[AttemptView], summaries: list[Summary]) -> str:
    return json.dumps(request(job, views, summaries))


def post(url: str, body: str, timeout_s: float = 30.0) -> None:
    """Send to an OTLP/HTTP receiver (``http://collector:4318``; ``/v1/traces`` is added
    when the URL has no path). A refusal is one line, never a traceback."""
    if url.rstrip("/").count("/") <= 2:
        url = url.rstrip("/") + "/v1/traces"
    shown = _without_credentials(url)
    headers = {"Content-Type": "application/json"}
    parts = urllib.parse.urlsplit(url)
    if parts.username is not None:   # user:password@ becomes basic auth, never a host name
        token = base64.b64encode(f"{urllib.parse.unquote(parts.username)}:"
                                 f"{urllib.parse.unquote(parts.password or '')}".encode())
        headers["Authorization"] = f"Basic {token.decode()}"
    req = urllib.request.Request(shown, data=body.encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            r.read()
    except urllib.error.HTTPError as e:
        raise TraceError(f"OTLP receiver {shown} refused the spans: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TraceError(f"cannot send spans to OTLP receiver {shown}: {reason}") from None


def _without_credentials(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=host))
