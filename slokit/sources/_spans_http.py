"""Gateway, client and router spans -> ``gateway`` and ``client`` fragments.

- gateway spans (kind SERVER) and client spans (kind CLIENT) that name a request id
  (:data:`REQUEST_ID_ATTRS`: ``slokit.request_id``, ``http.request.header.x-request-id``,
  Envoy's ``guid:x-request-id``, ``gen_ai.response.id``...), with http.* and current gen_ai.*
  names (``gen_ai.usage.input_tokens``...). A gateway span that names none but looks like a
  gateway's (llm-d's ``gateway.request``, Envoy's ``upstream_cluster``...) joins the request
  of its trace id in the store (``request_id``
  :data:`~slokit.store._trace_join.TRACE_ONLY_ID`). A gateway fragment's replica is the
  upstream engine the span names, never the gateway's own pod.
- LiteLLM's proxy: its ``litellm_request`` span (kind INTERNAL, marked by
  ``litellm.call_id``) is its gateway span; its ``gen_ai.response.id`` is the upstream's
  response id (vLLM's ``chatcmpl-<id>``: it joins vLLM's span by id), or LiteLLM's call id
  when the upstream failed. See :data:`LITELLM_CALL_ATTR`.
- a router's routing decision span (llm-d's ``pick_endpoints``): ``gateway_routing_s``.

A mapper returns None for a span it skips and raises :class:`SpanRejected` for one it
rejects.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from slokit.ids import checked_request_id
from slokit.records import FragmentSource, RequestFragment, RequestStatus
from slokit.sources._span_values import (
    SPAN_KIND_CLIENT,
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    ZERO_TRACE,
    AttrValue,
    SpanRejected,
    any_value,
    coerce,
    start_s,
)
from slokit.sources.validate import duration_problem
from slokit.store._trace_join import TRACE_ONLY_ID

if TYPE_CHECKING:
    from slokit.sources._otlp_map import MapSpan as Span

#: OTLP ``Span.SpanKind`` INTERNAL (LiteLLM's ``litellm_request``).
_SPAN_KIND_INTERNAL = 1

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
_CLIENT_DECLARED: dict[str, RequestStatus] = {"incomplete": "incomplete", "cancelled": "cancelled"}

#: Span attributes that name the request id, first found wins. Envoy tags its spans with
#: ``guid:x-request-id`` (envoyproxy/envoy, Tracing::Tags GuidXRequestId, for every tracer
#: including OpenTelemetry); OpenTelemetry's HTTP conventions capture a header as
#: ``http.request.header.<name>`` (a list of strings); the rest are common spellings.
REQUEST_ID_ATTRS = (
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

#: The attribute marking LiteLLM's LLM call span (``litellm_request``, kind INTERNAL: LiteLLM
#: ``integrations/opentelemetry.py``), the span that names the request: ``gen_ai.response.id``
#: (the upstream's response id, or LiteLLM's call id when no response came), ``gen_ai.*``
#: model and usage, and on a failure ``http.response.status_code`` and ``error.type``. Its
#: duration is LiteLLM's call (one attempt when it failed), not the proxy's auth and
#: pre-call time. LiteLLM's own SERVER span (``Received Proxy Server Request``) names no
#: request and stays skipped: joined by trace it would pick any request of a trace that a
#: client reuses for several calls.
LITELLM_CALL_ATTR = "litellm.call_id"


def is_routing_span(name: str) -> bool:
    """Whether a span of this name is a router's routing decision."""
    return name in _ROUTING_SPANS or name.startswith("gateway.scheduling.")


def is_http_span(span: Span) -> bool:
    """Whether a span is a gateway's (kind SERVER, or LiteLLM's INTERNAL ``litellm_request``)
    or a client's (kind CLIENT)."""
    if span.kind == _SPAN_KIND_INTERNAL:
        return LITELLM_CALL_ATTR in span.attributes
    return span.kind in (SPAN_KIND_SERVER, SPAN_KIND_CLIENT)


def http_fragment(span: Span, now: float) -> RequestFragment | None:
    """The fragment of a gateway or client span; None when it is neither worth keeping nor
    rejected (no request id and nothing gateway-like)."""
    attrs = {k: any_value(v) for k, v in span.attributes.items()}
    raw_id = _first_string(attrs, REQUEST_ID_ATTRS)
    trace_ok = len(span.trace_id) == 16 and span.trace_id != ZERO_TRACE
    if raw_id is None:
        if not _joins_by_trace(span, attrs):
            return None
        # No id: it joins the request of its trace (slokit.store._trace_join); without a
        # trace id it never can: rejected here, with its reason, like any span that cannot
        # become a record.
        if not trace_ok:
            raise SpanRejected("no request id and no trace id: it cannot join a request")
        request_id = TRACE_ONLY_ID
    elif not trace_ok:
        raise SpanRejected("empty or malformed trace id")
    else:
        request_id = checked_request_id(raw_id)
    values: dict[str, Any] = {}
    for key, fname in _HTTP_ATTRS.items():
        if key in attrs and values.get(fname) is None:
            values[fname] = coerce(key, fname, attrs[key])
    if isinstance(reason := values.get("finish_reason"), str):
        values["finish_reason"] = _first_reason(reason)
    source: FragmentSource = "client" if span.kind == SPAN_KIND_CLIENT else "gateway"
    start = start_s(span, now)
    dur = (
        (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
        if span.end_time_unix_nano and span.start_time_unix_nano
        else None
    )
    if dur is not None and (why := duration_problem(dur)):
        raise SpanRejected("span end before its start" if dur < 0 else f"span duration {why}")
    http_status = values.get("http_status")
    status: RequestStatus | None
    declared = attrs.get("slokit.status")
    if isinstance(declared, str) and declared in _CLIENT_DECLARED:
        # The client's own choice (it gave up, or its load test ended), whatever HTTP said.
        status = _CLIENT_DECLARED[declared]
    elif span.status.code == STATUS_ERROR or (http_status is not None and http_status >= 400):
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
    return RequestFragment(
        request_id=request_id,
        source=source,
        fragment_id=f"{source}:{span.span_id.hex()}",
        trace_id=span.trace_id.hex() if trace_ok else None,
        replica=_upstream(attrs) if source == "gateway" else None,
        arrival_ts=start,
        status=status,
        **values,
    )


def routing_fragment(span: Span, now: float) -> RequestFragment | None:
    """A router's routing decision span: a gateway fragment holding only its duration,
    joined to the request by id when it names one, else by trace id; None (skipped) when
    it has no duration."""
    attrs = {k: any_value(v) for k, v in span.attributes.items()}
    raw_id = _first_string(attrs, REQUEST_ID_ATTRS)
    trace_ok = len(span.trace_id) == 16 and span.trace_id != ZERO_TRACE
    if raw_id is not None and not trace_ok:
        raise SpanRejected("empty or malformed trace id")
    start_s(span, now)  # rejects an implausible start
    if not (span.end_time_unix_nano and span.start_time_unix_nano):
        return None
    dur = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    if why := duration_problem(dur):
        raise SpanRejected("span end before its start" if dur < 0 else f"span duration {why}")
    return RequestFragment(
        request_id=TRACE_ONLY_ID if raw_id is None else checked_request_id(raw_id),
        source="gateway",
        fragment_id=f"gateway:{span.span_id.hex()}",
        trace_id=span.trace_id.hex() if trace_ok else None,
        gateway_routing_s=dur,
    )


def _first_string(attrs: dict[str, AttrValue], keys: tuple[str, ...]) -> str | None:
    """The first non-empty value of ``keys`` (the first item of a list), as a string."""
    for key in keys:
        v = attrs.get(key)
        if isinstance(v, list):
            v = v[0] if v else None
        if v:
            return str(v)
    return None


def _joins_by_trace(span: Span, attrs: dict[str, AttrValue]) -> bool:
    """Whether a span without a request id is a gateway's (or an LLM client's), worth joining
    to its request by trace id."""
    if span.name in _GATEWAY_SPAN_NAMES or any(k.startswith("gen_ai.") for k in attrs):
        return True
    return span.kind == SPAN_KIND_SERVER and (
        any(k in attrs for k in _GATEWAY_MARKERS) or attrs.get("component") == "proxy"
    )


def _first_reason(value: str) -> str | None:
    """A finish reason; LiteLLM sends ``gen_ai.response.finish_reasons`` as a JSON list in
    a string (``'["length"]'``): its first item."""
    if not value.startswith("["):
        return value
    try:
        reasons = json.loads(value)
    except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
        return value
    if isinstance(reasons, list):
        if not reasons:
            return None
        first = reasons[0]
        return value if isinstance(first, (list, dict)) else str(first)  # no deep repr
    return value


def _upstream(attrs: dict[str, AttrValue]) -> str | None:
    """The upstream engine a gateway span names (host:port without the port), else None."""
    name = _first_string(attrs, _UPSTREAM_ATTRS)
    if name is None:
        return None
    host, sep, port = name.rpartition(":")
    if sep and port.isdigit() and host and not host.endswith(":"):
        name = host.strip("[]")
    return name[:253] or None
