"""OTLP traces -> request fragments.

Accepts ``ExportTraceServiceRequest`` as protobuf or OTLP/JSON, gzip or not. Three kinds of span
become fragments:

- vLLM's ``llm_request`` span (scope ``vllm.tracing.otel``): every ``gen_ai.latency.*`` and
  ``gen_ai.usage.*`` attribute; start time = arrival (:mod:`slokit.sources._spans_vllm`).
- gateway spans (kind SERVER) and client spans (kind CLIENT) that name a request id
  (:data:`~slokit.sources._spans_http.REQUEST_ID_ATTRS`: ``slokit.request_id``,
  ``http.request.header.x-request-id``, Envoy's ``guid:x-request-id``,
  ``gen_ai.response.id``...), with http.* and current gen_ai.* names
  (``gen_ai.usage.input_tokens``...). A gateway span that names none but looks like a
  gateway's (llm-d's ``gateway.request``, Envoy's ``upstream_cluster``...) joins the request
  of its trace id in the store (``request_id``
  :data:`~slokit.store._trace_join.TRACE_ONLY_ID`). A gateway fragment's replica is the
  upstream engine the span names, never the gateway's own pod.
- a router's routing decision span (llm-d's ``pick_endpoints``): ``gateway_routing_s``
  (these two: :mod:`slokit.sources._spans_http`).

Everything else (vLLM start-up spans, unrelated spans) is skipped, not rejected. Spans with an
empty or malformed trace id, an ``llm_request`` without a request id, a request id that is
empty once normalized, or an implausible value (a latency that is NaN, infinite, negative or
over a week, a token count that is not a whole number up to 10**9, a start time before 2000 or
more than a day ahead, an end before the start: :mod:`slokit.sources.validate`) are rejected
one by one with a reason and counted (OTLP ``partial_success``): one bad span never fails the
others of its export, nor other exports. A value of the wrong type (a string that is not a
number) is a missing fact (:mod:`slokit.sources._span_values`). Prompt and completion text
attributes are never read.

This module is the wire: Content-Encoding, protobuf or OTLP/JSON (hex ids), the resource's
replica, and which mapper each span goes to.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from slokit.errors import BadInput
from slokit.ids import InvalidRequestId
from slokit.records import RequestFragment
from slokit.sources._otlp_map import ExportTraceServiceRequest as MapExport
from slokit.sources._span_values import SpanRejected, any_value
from slokit.sources._spans_http import (
    http_fragment,
    is_http_span,
    is_routing_span,
    routing_fragment,
)
from slokit.sources._spans_vllm import vllm_fragment

if TYPE_CHECKING:
    from collections.abc import Iterator

    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

#: Resource attributes that name the replica, most specific first.
REPLICA_ATTRIBUTES = ("k8s.pod.name", "service.instance.id", "host.name")


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


#: :func:`inflated_size` inflates this many bytes at a time, keeping none.
INFLATE_STEP = 1024 * 1024


def decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """Undo Content-Encoding (gzip/deflate/identity), never expanding past ``max_bytes``.

    Raises :class:`BadInput` for corrupt data and :class:`PayloadTooLarge` past the limit
    (a gzip bomb is stopped after ``max_bytes``, not inflated whole).
    """
    if encoding_name(encoding) == "identity":
        if len(body) > max_bytes:
            raise PayloadTooLarge(f"body of {len(body)} bytes exceeds the {max_bytes}-byte limit")
        return body
    parts = list(_inflate(body, encoding, max_bytes, max_bytes + 1))
    return parts[0] if len(parts) == 1 else b"".join(parts)


def inflated_size(body: bytes, encoding: str | None, max_bytes: int) -> int:
    """The bytes :func:`decompress` would return, counted without keeping them (memory: one
    :data:`INFLATE_STEP`): what the sidecar's body budget holds for a compressed body before
    it is inflated. Raises as :func:`decompress`."""
    if encoding_name(encoding) == "identity":
        return len(decompress(body, encoding, max_bytes))
    return sum(len(part) for part in _inflate(body, encoding, max_bytes, INFLATE_STEP))


def encoding_name(encoding: str | None) -> str:
    """A ``Content-Encoding`` as ``identity``, ``gzip`` or ``deflate`` (BadInput for any other)."""
    enc = (encoding or "identity").strip().lower() or "identity"
    if enc == "x-gzip":
        return "gzip"
    if enc not in ("identity", "gzip", "deflate"):
        raise BadInput(f"unsupported Content-Encoding {encoding!r}")
    return enc


def _inflate(body: bytes, encoding: str | None, max_bytes: int, step: int) -> Iterator[bytes]:
    """A gzip or deflate body's content, at most ``step`` bytes at a time."""
    enc = encoding_name(encoding)
    wbits = 16 + zlib.MAX_WBITS if enc == "gzip" else zlib.MAX_WBITS
    total = 0
    data = body
    try:
        while True:  # gzip allows several members one after another (RFC 1952): read each
            d = zlib.decompressobj(wbits)
            pending = data
            while True:
                part = d.decompress(pending, min(step, max_bytes + 1 - total))
                total += len(part)
                if total > max_bytes:
                    raise PayloadTooLarge(f"decompressed body exceeds the {max_bytes}-byte limit")
                if part:
                    yield part
                stuck = not part and d.unconsumed_tail == pending
                pending = d.unconsumed_tail
                if d.eof or not pending or stuck:
                    break
            if not d.eof:
                raise BadInput(f"truncated {enc} body")
            data = d.unused_data
            if not data:
                break
    except zlib.error as exc:
        raise BadInput(f"corrupt {enc} body: {exc}") from None


class PayloadTooLarge(BadInput):
    """The (decompressed) body is over the configured limit (HTTP 413)."""


_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf", "application/octet-stream", "")


def parse_request(
    body: bytes, content_type: str = "application/x-protobuf"
) -> ExportTraceServiceRequest:
    """Bytes -> ExportTraceServiceRequest (OpenTelemetry's message, as sent: what a forwarder
    re-serializes), protobuf or OTLP/JSON by ``content_type``."""
    ct = _media_type(content_type)
    if ct in _PROTOBUF_TYPES:
        return _parse_protobuf(ExportTraceServiceRequest, body)
    msg = ExportTraceServiceRequest()
    if ct == "application/json":
        try:
            doc = json.loads(body)
        except ValueError as exc:  # not UTF-8, not JSON, a number of 5,000 digits, ...
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


def parse_spans(body: bytes, content_type: str = "application/x-protobuf") -> Any:
    """Bytes -> the decoder's view of an ExportTraceServiceRequest, whose spans' attributes
    are maps (:mod:`slokit.sources._otlp_map`): what :func:`decode_message` reads. Protobuf
    is parsed straight into it; OTLP/JSON (whose attributes are lists) by way of
    :func:`parse_request`. Errors as :func:`parse_request`'s."""
    if _media_type(content_type) in _PROTOBUF_TYPES:
        return _parse_protobuf(MapExport, body)
    return MapExport.FromString(parse_request(body, content_type).SerializeToString())


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def _parse_protobuf(cls: Any, body: bytes) -> Any:
    """``body`` parsed as a ``cls`` message; BadInput if it is not one."""
    msg = cls()
    try:
        msg.ParseFromString(body)
    except (DecodeError, RuntimeError) as exc:
        raise BadInput(f"undecodable OTLP protobuf: {exc}") from None
    return msg


class UnsupportedMediaType(BadInput):
    """Neither protobuf nor JSON (HTTP 415)."""


#: Deepest JSON nesting read. OTLP needs about 16 levels plus 3 per nested attribute value,
#: and protobuf refuses messages nested over 100 deep anyway.
MAX_JSON_DEPTH = 256

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


def _hex_ids_to_base64(doc: Any, depth: int = 0) -> Any:
    """OTLP/JSON encodes trace and span ids as hex; protobuf's JSON mapping wants base64.
    Converted in place: a copy of the whole parsed document would double the memory a JSON
    body takes while it is decoded (about 16 times its bytes)."""
    if depth > MAX_JSON_DEPTH:
        raise BadInput(f"OTLP JSON nested more than {MAX_JSON_DEPTH} levels deep")
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in _ID_KEYS and isinstance(v, str):
                try:
                    doc[k] = base64.b64encode(bytes.fromhex(v)).decode()
                except ValueError:
                    raise BadInput(f"{k} is not hex: {v[:40]!r}") from None
            elif isinstance(v, dict | list):
                _hex_ids_to_base64(v, depth + 1)
    elif isinstance(doc, list):
        for x in doc:
            if isinstance(x, dict | list):
                _hex_ids_to_base64(x, depth + 1)
    return doc


def _resource_replica(resource: Resource, default: str | None) -> str | None:
    """``k8s.pod.name`` wins; then the configured default (the sidecar's own pod), then the
    process-level ids, which are stable only for one process's life."""
    found: dict[str, str] = {}
    for kv in resource.attributes:
        if kv.key in REPLICA_ATTRIBUTES:
            found[kv.key] = str(any_value(kv.value))
    for name in (
        found.get("k8s.pod.name"),
        default,
        *(found.get(k) for k in REPLICA_ATTRIBUTES[1:]),
    ):
        if name:
            return name
    return None


def decode_message(
    msg: Any,
    *,
    default_replica: str | None = None,
    now: float | None = None,
) -> DecodedTraces:
    """Fragments of one export, as :func:`parse_spans` gives it; ``now`` (epoch seconds,
    default the clock) bounds start times."""
    out = DecodedTraces()
    frags = out.fragments
    now_s = time.time() if now is None else now
    for rs in msg.resource_spans:
        replica = _resource_replica(rs.resource, default_replica)
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.spans += 1
                frag: RequestFragment | None
                try:
                    if span.name == "llm_request":
                        frag = vllm_fragment(span, replica, now_s)
                    elif is_routing_span(span.name):
                        frag = routing_fragment(span, now_s)
                    elif is_http_span(span):
                        frag = http_fragment(span, now_s)
                    else:
                        frag = None
                except SpanRejected as exc:
                    out.reject(str(exc))
                    continue
                except InvalidRequestId as exc:
                    out.reject(exc.reason)
                    continue
                if frag is None:
                    out.skipped += 1
                else:
                    frags.append(frag)
    return out


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
    return decode_message(parse_spans(raw, content_type), default_replica=default_replica, now=now)
