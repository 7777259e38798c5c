"""OTLP traces -> request fragments.

Accepts ``ExportTraceServiceRequest`` as protobuf or OTLP/JSON, gzip or not. Three kinds of span
become fragments:

- vLLM's ``llm_request`` span (scope ``vllm.tracing.otel``): every ``gen_ai.latency.*`` and
  ``gen_ai.usage.*`` attribute; start time = arrival.
- gateway spans (kind SERVER) and client spans (kind CLIENT) that name a request id
  (:data:`_REQUEST_ID_ATTRS`: ``slokit.request_id``, ``http.request.header.x-request-id``,
  Envoy's ``guid:x-request-id``, ``gen_ai.response.id``...), with http.* and current gen_ai.*
  names (``gen_ai.usage.input_tokens``...). A gateway span that names none but looks like a
  gateway's (llm-d's ``gateway.request``, Envoy's ``upstream_cluster``...) joins the request
  of its trace id in the store (``request_id`` :data:`TRACE_ONLY_ID`). A gateway fragment's
  replica is the upstream engine the span names, never the gateway's own pod.
- a router's routing decision span (llm-d's ``pick_endpoints``): ``gateway_routing_s``.

Everything else (vLLM start-up spans, unrelated spans) is skipped, not rejected. Spans with an
empty or malformed trace id, an ``llm_request`` without a request id, a request id that is
empty once normalized, or an implausible value (a latency that is NaN, infinite, negative or
over a week, a token count that is not a whole number up to 10**9, a start time before 2000 or
more than a day ahead, an end before the start: :mod:`slokit.sources.validate`) are rejected
one by one with a reason and counted (OTLP ``partial_success``): one bad span never fails the
others of its export, nor other exports. A value of the wrong type (a string that is not a
number) is a missing fact. Prompt and completion text attributes are never read.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from slokit.errors import BadInput
from slokit.ids import InvalidRequestId, checked_request_id
from slokit.records import FragmentSource, RequestFragment, RequestStatus
from slokit.sources.validate import (
    FUTURE_SLACK_S,
    HTTP_STATUS_RANGE,
    MAX_DURATION_S,
    MAX_INT64,
    MAX_TOKENS,
    MIN_TS,
    duration_problem,
    int_problem,
    timestamp_problem,
)
from slokit.store._trace_join import TRACE_ONLY_ID

#: Resource attributes that name the replica, most specific first.
REPLICA_ATTRIBUTES = ("k8s.pod.name", "service.instance.id", "host.name")

_SPAN_KIND_SERVER = 2
_SPAN_KIND_CLIENT = 3
_STATUS_ERROR = 2
_ZERO_TRACE = b"\0" * 16

#: vLLM llm_request attribute -> RequestFragment field.
_VLLM_ATTRS: dict[str, str] = {
    "gen_ai.latency.time_in_queue": "queue_s",
    "gen_ai.latency.time_to_first_token": "ttft_s",
    "gen_ai.latency.e2e": "e2e_s",
    "gen_ai.latency.time_in_model_prefill": "prefill_s",
    "gen_ai.latency.time_in_model_decode": "decode_s",
    "gen_ai.latency.time_in_model_inference": "inference_s",
    "gen_ai.usage.prompt_tokens": "prompt_tokens",
    "gen_ai.usage.completion_tokens": "output_tokens",
    "gen_ai.usage.input_tokens": "prompt_tokens",
    "gen_ai.usage.output_tokens": "output_tokens",
    "gen_ai.usage.cached_tokens": "cached_tokens",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.response.model": "model",
    "gen_ai.request.model": "model",
}

#: Gateway/client span attribute -> RequestFragment field.
_HTTP_ATTRS: dict[str, str] = {
    "gen_ai.request.model": "model",
    "gen_ai.response.model": "model",
    "gen_ai.usage.input_tokens": "prompt_tokens",
    "gen_ai.usage.output_tokens": "output_tokens",
    "gen_ai.usage.prompt_tokens": "prompt_tokens",
    "gen_ai.usage.completion_tokens": "output_tokens",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.response.finish_reasons": "finish_reason",
    "http.response.status_code": "http_status",
    "http.status_code": "http_status",
    "error.type": "error_type",
    "slokit.slo_class": "slo_class",
    "slokit.task_id": "task_id",
    "slokit.tenant": "tenant",
    "slokit.client.ttft_s": "client_ttft_s",
    "gen_ai.server.time_to_first_token": "client_ttft_s",
}

#: ``slokit.status`` values a client span may declare: outcomes only the client knows (it
#: cancelled, or its load test ended with the request in flight: ``incomplete``, never a
#: failure of the server). Other values are judged from the span's HTTP status as usual.
_CLIENT_DECLARED: dict[Any, RequestStatus] = {"incomplete": "incomplete", "cancelled": "cancelled"}

#: Integer fields and their largest plausible value (see slokit.sources.validate).
_INT_LIMITS: dict[str, int] = {
    "prompt_tokens": MAX_TOKENS,
    "output_tokens": MAX_TOKENS,
    "cached_tokens": MAX_TOKENS,
    "max_tokens": MAX_INT64,
    "http_status": HTTP_STATUS_RANGE[1],
}
_INT_FIELDS = frozenset(_INT_LIMITS)
_FLOAT_FIELDS = frozenset({"client_ttft_s"})
_DURATION_FIELDS = frozenset(f for f in _VLLM_ATTRS.values() if f.endswith("_s"))

#: Span attributes that name the request id, first found wins. Envoy tags its spans with
#: ``guid:x-request-id`` (envoyproxy/envoy, Tracing::Tags GuidXRequestId, for every tracer
#: including OpenTelemetry); OpenTelemetry's HTTP conventions capture a header as
#: ``http.request.header.<name>`` (a list of strings); the rest are common spellings.
_REQUEST_ID_ATTRS = (
    "slokit.request_id",
    "http.request.header.x-request-id",
    "http.request.header.x_request_id",
    "guid:x-request-id",
    "x-request-id",
    "x_request_id",
    "request_id",
    "gen_ai.request.id",
    "gen_ai.response.id",
)

#: Attributes of a gateway span naming the upstream engine it sent the request to, first
#: found wins (Envoy: ``upstream_address``, host:port; the port is dropped). Never the
#: gateway's own pod (its resource): a request the gateway answered itself has no replica.
_UPSTREAM_ATTRS = (
    "slokit.replica",
    "upstream.pod.name",
    "upstream_address",
    "upstream.address",
    "net.peer.name",
)

#: Span names of a router's routing decision (llm-d's endpoint picker: ``pick_endpoints``
#: under ``gateway.request``, and its ``gateway.scheduling.*`` plugin spans): their duration
#: is the request's ``gateway_routing_s``.
_ROUTING_SPANS = frozenset(
    {"pick_endpoints", "gateway.scheduling", "gateway.request_orchestration"}
)

#: Without a request id, a span joins its request by trace id only when it looks like a
#: gateway's: the llm-d router's root span, or an attribute Envoy (or a gen_ai-aware proxy)
#: sets. Other spans (health checks, an instrumented API server) are skipped as before.
_GATEWAY_SPAN_NAMES = frozenset({"gateway.request"})
_GATEWAY_MARKERS = ("upstream_cluster", "upstream_address", "upstream.address", "response_flags")


@dataclass
class DecodedTraces:
    """What one OTLP payload yielded."""

    fragments: list[RequestFragment] = field(default_factory=list)
    spans: int = 0
    skipped: int = 0
    rejected: int = 0
    rejection_reasons: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str) -> None:
        self.rejected += 1
        self.rejection_reasons[reason] = self.rejection_reasons.get(reason, 0) + 1

    def extend(self, other: DecodedTraces) -> None:
        self.fragments.extend(other.fragments)
        self.spans += other.spans
        self.skipped += other.skipped
        self.rejected += other.rejected
        for k, v in other.rejection_reasons.items():
            self.rejection_reasons[k] = self.rejection_reasons.get(k, 0) + v


def decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """Undo Content-Encoding (gzip/deflate/identity), never expanding past ``max_bytes``.

    Raises :class:`BadInput` for corrupt data and :class:`PayloadTooLarge` past the limit
    (a gzip bomb is stopped after ``max_bytes``, not inflated whole).
    """
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        if len(body) > max_bytes:
            raise PayloadTooLarge(f"body of {len(body)} bytes exceeds the {max_bytes}-byte limit")
        return body
    if enc not in ("gzip", "deflate", "x-gzip"):
        raise BadInput(f"unsupported Content-Encoding {encoding!r}")
    wbits = 16 + zlib.MAX_WBITS if enc in ("gzip", "x-gzip") else zlib.MAX_WBITS
    parts: list[bytes] = []
    total = 0
    data = body
    try:
        while True:  # gzip allows several members one after another (RFC 1952): read each
            d = zlib.decompressobj(wbits)
            part = d.decompress(data, max_bytes + 1 - total)
            parts.append(part)
            total += len(part)
            if total > max_bytes or d.unconsumed_tail:
                raise PayloadTooLarge(f"decompressed body exceeds the {max_bytes}-byte limit")
            if not d.eof:
                raise BadInput(f"truncated {enc} body")
            data = d.unused_data
            if not data:
                break
    except zlib.error as exc:
        raise BadInput(f"corrupt {enc} body: {exc}") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


class PayloadTooLarge(BadInput):
    """The (decompressed) body is over the configured limit (HTTP 413)."""


def parse_request(
    body: bytes, content_type: str = "application/x-protobuf"
) -> ExportTraceServiceRequest:
    """Bytes -> ExportTraceServiceRequest, protobuf or OTLP/JSON by ``content_type``."""
    ct = (content_type or "").split(";")[0].strip().lower()
    msg = ExportTraceServiceRequest()
    if ct in ("application/x-protobuf", "application/protobuf", "application/octet-stream", ""):
        try:
            msg.ParseFromString(body)
        except (DecodeError, RuntimeError) as exc:
            raise BadInput(f"undecodable OTLP protobuf: {exc}") from None
        return msg
    if ct == "application/json":
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadInput(f"undecodable OTLP JSON: {exc}") from None
        except RecursionError:
            raise BadInput("OTLP JSON nested too deeply") from None
        doc = _hex_ids_to_base64(doc)
        try:
            json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
        except (json_format.ParseError, TypeError, ValueError, AttributeError) as exc:
            raise BadInput(f"OTLP JSON does not match ExportTraceServiceRequest: {exc}") from None
        except RecursionError:
            raise BadInput("OTLP JSON nested too deeply") from None
        return msg
    raise UnsupportedMediaType(f"unsupported Content-Type {content_type!r}")


class UnsupportedMediaType(BadInput):
    """Neither protobuf nor JSON (HTTP 415)."""


#: Deepest JSON nesting read. OTLP needs about 16 levels plus 3 per nested attribute value,
#: and protobuf refuses messages nested over 100 deep anyway.
MAX_JSON_DEPTH = 256

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


def _hex_ids_to_base64(doc: Any, depth: int = 0) -> Any:
    """OTLP/JSON encodes trace and span ids as hex; protobuf's JSON mapping wants base64."""
    if depth > MAX_JSON_DEPTH:
        raise BadInput(f"OTLP JSON nested more than {MAX_JSON_DEPTH} levels deep")
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k in _ID_KEYS and isinstance(v, str):
                try:
                    out[k] = base64.b64encode(bytes.fromhex(v)).decode()
                except ValueError:
                    raise BadInput(f"{k} is not hex: {v[:40]!r}") from None
            else:
                out[k] = _hex_ids_to_base64(v, depth + 1)
        return out
    if isinstance(doc, list):
        return [_hex_ids_to_base64(x, depth + 1) for x in doc]
    return doc


def _any_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "array_value":
        return [_any_value(x) for x in v.array_value.values]
    return None


def _resource_replica(resource: Any, default: str | None) -> str | None:
    """``k8s.pod.name`` wins; then the configured default (the sidecar's own pod), then the
    process-level ids, which are stable only for one process's life."""
    found: dict[str, str] = {}
    for kv in resource.attributes:
        if kv.key in REPLICA_ATTRIBUTES:
            found[kv.key] = str(_any_value(kv.value))
    for name in (
        found.get("k8s.pod.name"),
        default,
        *(found.get(k) for k in REPLICA_ATTRIBUTES[1:]),
    ):
        if name:
            return name
    return None


class _Rejected(Exception):
    """A span with an implausible value; the message is the reason (a metric label)."""


def _coerce(key: str, field_name: str, value: Any) -> Any:
    """An attribute value as its field's type: None when it is of the wrong type (a missing
    fact); :class:`_Rejected` when it is a number that cannot be true."""
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return None
    if field_name in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return None
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                return None
        why = int_problem(value, _INT_LIMITS[field_name])
        if why is None and field_name == "http_status" and value < HTTP_STATUS_RANGE[0]:
            why = "is out of range"
        if why is not None:
            raise _Rejected(f"{key} {why}")
        return int(value)
    if field_name in _FLOAT_FIELDS or field_name.endswith("_s"):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return None
        try:
            x = float(value)
        except (ValueError, OverflowError):
            return None
        if why := duration_problem(x):
            raise _Rejected(f"{key} {why}")
        return x
    return str(value)


def decode_message(
    msg: ExportTraceServiceRequest,
    *,
    default_replica: str | None = None,
    now: float | None = None,
) -> DecodedTraces:
    """Fragments of one export; ``now`` (epoch seconds, default the clock) bounds start times."""
    out = DecodedTraces()
    frags = out.fragments
    now_s = time.time() if now is None else now
    for rs in msg.resource_spans:
        replica = _resource_replica(rs.resource, default_replica)
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.spans += 1
                try:
                    if span.name == "llm_request":
                        _vllm_span(span, replica, out, frags, now_s)
                    elif span.name in _ROUTING_SPANS or span.name.startswith("gateway.scheduling."):
                        _routing_span(span, out, frags, now_s)
                    elif span.kind in (_SPAN_KIND_SERVER, _SPAN_KIND_CLIENT):
                        _http_span(span, replica, out, frags, now_s)
                    else:
                        out.skipped += 1
                except _Rejected as exc:
                    out.reject(str(exc))
                except InvalidRequestId as exc:
                    out.reject(exc.reason)
    return out


def _start_s(span: Any, now: float) -> float | None:
    """The span's start in epoch seconds (None when unset); :class:`_Rejected` if implausible."""
    start_ns = span.start_time_unix_nano
    if not start_ns:
        return None
    start = start_ns / 1e9
    if why := timestamp_problem(start, now):
        raise _Rejected(f"span start time {why}")
    return start


def _vllm_span(
    span: Any, replica: str | None, out: DecodedTraces, frags: list[RequestFragment], now: float
) -> None:
    # The hot path of ingest: one pass over the attributes, no per-attribute function calls
    # for durations (the common case). Raises _Rejected for an implausible value.
    trace_id = span.trace_id
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE:
        out.reject("empty or malformed trace id")
        return
    values: dict[str, Any] = {}
    raw_id = None
    for kv in span.attributes:
        key = kv.key
        if key == "gen_ai.request.id":
            raw_id = kv.value.string_value
            continue
        fname = _VLLM_ATTRS.get(key)
        if fname is None:
            continue
        v = kv.value
        which = v.WhichOneof("value")
        if which == "double_value":
            x: Any = v.double_value
        elif which == "int_value":
            x = v.int_value
        elif which == "string_value":
            x = v.string_value
        else:
            continue
        if fname in _DURATION_FIELDS:
            try:
                d = float(x)
            except ValueError:
                continue  # a malformed value is a missing fact, not a guess
            if not 0.0 <= d <= MAX_DURATION_S:  # also NaN
                raise _Rejected(f"{key} {duration_problem(d)}")
            values[fname] = d
        elif fname in _INT_FIELDS:
            if which == "int_value" and 0 <= x <= _INT_LIMITS[fname]:
                values[fname] = x  # the common case
                continue
            if which == "string_value":
                try:
                    x = int(x)
                except ValueError:
                    continue
            if why := int_problem(x, _INT_LIMITS[fname]):
                raise _Rejected(f"{key} {why}")
            values[fname] = int(x)
        else:
            values[fname] = str(x)
    if not raw_id:
        out.reject("llm_request span without gen_ai.request.id")
        return
    request_id = checked_request_id(raw_id, from_span=True)
    start_ns = span.start_time_unix_nano
    arrival = start_ns / 1e9 if start_ns else None
    if arrival is not None and not MIN_TS <= arrival <= now + FUTURE_SLACK_S:
        raise _Rejected(f"span start time {timestamp_problem(arrival, now)}")
    frags.append(
        RequestFragment(
            request_id=request_id,
            source="vllm",
            fragment_id="vllm:" + span.span_id.hex(),
            trace_id=trace_id.hex(),
            replica=replica,
            arrival_ts=arrival,
            status="error" if span.status.code == _STATUS_ERROR else None,
            **values,
        )
    )


def _http_span(
    span: Any, replica: str | None, out: DecodedTraces, frags: list[RequestFragment], now: float
) -> None:
    attrs = {kv.key: _any_value(kv.value) for kv in span.attributes}
    raw_id = _first_string(attrs, _REQUEST_ID_ATTRS)
    trace_ok = len(span.trace_id) == 16 and span.trace_id != _ZERO_TRACE
    if raw_id is None:
        if not _joins_by_trace(span, attrs):
            out.skipped += 1
            return
        # No id: it joins the request of its trace (slokit.store._trace_join); without a
        # trace id it never can, and the store counts it as unjoined (no_trace_id).
        request_id = TRACE_ONLY_ID
    elif not trace_ok:
        out.reject("empty or malformed trace id")
        return
    else:
        request_id = checked_request_id(raw_id)
    values: dict[str, Any] = {}
    for key, fname in _HTTP_ATTRS.items():
        if key in attrs and values.get(fname) is None:
            values[fname] = _coerce(key, fname, attrs[key])
    source: FragmentSource = "client" if span.kind == _SPAN_KIND_CLIENT else "gateway"
    start_s = _start_s(span, now)
    dur = (
        (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
        if span.end_time_unix_nano and span.start_time_unix_nano
        else None
    )
    if dur is not None and (why := duration_problem(dur)):
        raise _Rejected("span end before its start" if dur < 0 else f"span duration {why}")
    http_status = values.get("http_status")
    status: RequestStatus | None
    declared = attrs.get("slokit.status")
    if isinstance(declared, str) and declared in _CLIENT_DECLARED:
        # The client's own choice (it gave up, or its load test ended), whatever HTTP said.
        status = _CLIENT_DECLARED[declared]
    elif span.status.code == _STATUS_ERROR or (http_status is not None and http_status >= 400):
        status = "error"
        if http_status == 429:
            status = "rejected"
        elif http_status in (408, 504) or values.get("error_type") == "timeout":
            status = "timeout"
    elif http_status is not None or dur is not None:
        status = "ok"
    else:
        status = None
    dur_field = "client_e2e_s" if source == "client" else "gateway_e2e_s"
    values[dur_field] = dur
    frags.append(
        RequestFragment(
            request_id=request_id,
            source=source,
            fragment_id=f"{source}:{span.span_id.hex()}",
            trace_id=span.trace_id.hex() if trace_ok else None,
            replica=_upstream(attrs) if source == "gateway" else None,
            arrival_ts=start_s,
            status=status,
            **values,
        )
    )


def _first_string(attrs: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    """The first non-empty value of ``keys`` (the first item of a list), as a string."""
    for key in keys:
        v = attrs.get(key)
        if isinstance(v, list):
            v = v[0] if v else None
        if v:
            return str(v)
    return None


def _joins_by_trace(span: Any, attrs: dict[str, Any]) -> bool:
    """Whether a span without a request id is a gateway's (or an LLM client's), worth joining
    to its request by trace id."""
    if span.name in _GATEWAY_SPAN_NAMES or any(k.startswith("gen_ai.") for k in attrs):
        return True
    return span.kind == _SPAN_KIND_SERVER and (
        any(k in attrs for k in _GATEWAY_MARKERS) or attrs.get("component") == "proxy"
    )


def _upstream(attrs: dict[str, Any]) -> str | None:
    """The upstream engine a gateway span names (host:port without the port), else None."""
    name = _first_string(attrs, _UPSTREAM_ATTRS)
    if name is None:
        return None
    host, sep, port = name.rpartition(":")
    if sep and port.isdigit() and host and not host.endswith(":"):
        name = host.strip("[]")
    return name[:253] or None


def _routing_span(span: Any, out: DecodedTraces, frags: list[RequestFragment], now: float) -> None:
    """A router's routing decision span: a gateway fragment holding only its duration,
    joined to the request by id when it names one, else by trace id."""
    attrs = {kv.key: _any_value(kv.value) for kv in span.attributes}
    raw_id = _first_string(attrs, _REQUEST_ID_ATTRS)
    trace_ok = len(span.trace_id) == 16 and span.trace_id != _ZERO_TRACE
    if raw_id is not None and not trace_ok:
        out.reject("empty or malformed trace id")
        return
    _start_s(span, now)  # rejects an implausible start
    if not (span.end_time_unix_nano and span.start_time_unix_nano):
        out.skipped += 1
        return
    dur = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    if why := duration_problem(dur):
        raise _Rejected("span end before its start" if dur < 0 else f"span duration {why}")
    frags.append(
        RequestFragment(
            request_id=TRACE_ONLY_ID if raw_id is None else checked_request_id(raw_id),
            source="gateway",
            fragment_id=f"gateway:{span.span_id.hex()}",
            trace_id=span.trace_id.hex() if trace_ok else None,
            gateway_routing_s=dur,
        )
    )


def decode_traces(
    body: bytes,
    content_type: str = "application/x-protobuf",
    content_encoding: str | None = None,
    *,
    max_bytes: int = 64 * 1024 * 1024,
    default_replica: str | None = None,
    now: float | None = None,
) -> DecodedTraces:
    """Decode one OTLP/HTTP body (as sent over the wire) into fragments.

    Raises BadInput (400), UnsupportedMediaType (415) or PayloadTooLarge (413). Spans with
    implausible values are rejected one by one (``DecodedTraces.reject``); ``now`` (epoch
    seconds, default the clock) is what "more than a day ahead" is measured from.
    """
    raw = decompress(body, content_encoding, max_bytes)
    return decode_message(
        parse_request(raw, content_type), default_replica=default_replica, now=now
    )
