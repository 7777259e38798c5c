"""``--forward-otlp`` does not pass prompt or completion content downstream unless
``forward_content`` opts in: what slokit never stores does not leave the pod either."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from sidecar_harness import StartSidecar, post, relabel, wait_for

from slokit.sidecar.config import load_config
from slokit.sidecar.forward import is_content_attribute, is_content_event, without_content

CANARY = "CANARY-7f3a-prompt-text"
METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

#: Attribute keys that carry content, current and older GenAI conventions.
CONTENT_KEYS = [
    "gen_ai.prompt",
    "gen_ai.completion",
    "gen_ai.prompt.0.content",
    "gen_ai.completion.0.content",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
]
#: Events whose attributes or body are content.
CONTENT_EVENTS = [
    "gen_ai.content.prompt",
    "gen_ai.content.completion",
    "gen_ai.user.message",
    "gen_ai.system.message",
    "gen_ai.assistant.message",
    "gen_ai.tool.message",
    "gen_ai.choice",
]
#: Look-alikes that are not content and must travel on.
KEPT_KEYS = [
    "gen_ai.request.model",
    "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.completion_tokens",
    "gen_ai.prompt_tokens",
    "gen_ai.request.id",
]


def _with_content(body: bytes) -> bytes:
    """The export with every content form on every span, each holding the canary."""
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    for rs in msg.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                for key in CONTENT_KEYS:
                    span.attributes.append(KeyValue(key=key))
                    span.attributes[-1].value.string_value = f"{key}: {CANARY}"
                span.attributes.append(KeyValue(key="gen_ai.prompt_tokens"))
                span.attributes[-1].value.int_value = 7
                for name in CONTENT_EVENTS:
                    event = span.events.add(name=name)
                    event.attributes.append(KeyValue(key="content"))
                    event.attributes[-1].value.string_value = CANARY
                event = span.events.add(name="gen_ai.client.inference.operation.details")
                event.attributes.append(KeyValue(key="gen_ai.input.messages"))
                event.attributes[-1].value.string_value = CANARY
                event.attributes.append(KeyValue(key="gen_ai.response.model"))
                event.attributes[-1].value.string_value = "tiny"
    return msg.SerializeToString()


def _upstream() -> tuple[list[httpx.Request], httpx.MockTransport]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        return httpx.Response(200)

    return seen, httpx.MockTransport(handler)


def _decoded(request: httpx.Request) -> ExportTraceServiceRequest:
    content = request.content
    if request.headers.get("Content-Encoding") == "gzip":
        content = gzip.decompress(content)
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(content)
    return msg


def _spans(msg: ExportTraceServiceRequest) -> list[Any]:
    return [s for rs in msg.resource_spans for ss in rs.scope_spans for s in ss.spans]


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_content_is_stripped_from_forwarded_bodies_and_the_rest_kept(
    start_sidecar: StartSidecar, export_body: bytes, encoding: str | None
) -> None:
    seen, transport = _upstream()
    sc = start_sidecar(forward_otlp="http://collector:4318", forward_transport=transport)
    raw, _ = relabel(_with_content(export_body), "strip")
    body = gzip.compress(raw) if encoding else raw
    headers = {"Content-Encoding": encoding} if encoding else {}
    assert post(sc.otlp, body, **headers).status_code == 200
    wait_for(lambda: len(seen) == 1, what="forwarded body")
    (req,) = seen
    assert req.headers.get("Content-Encoding") == encoding
    assert req.headers["Content-Type"] == "application/x-protobuf"
    forwarded = _decoded(req)
    assert CANARY.encode() not in forwarded.SerializeToString()
    spans = _spans(forwarded)
    assert len(spans) == 64
    for span in spans:
        keys = {kv.key for kv in span.attributes}
        assert not keys & set(CONTENT_KEYS)
        assert {"gen_ai.request.id", "gen_ai.prompt_tokens"} <= keys
        assert span.dropped_attributes_count == len(CONTENT_KEYS)
        assert [e.name for e in span.events] == ["gen_ai.client.inference.operation.details"]
        assert span.dropped_events_count == len(CONTENT_EVENTS)
        assert [kv.key for kv in span.events[0].attributes] == ["gen_ai.response.model"]
    assert [s.span_id for s in spans] == [s.span_id for s in _spans(_parse(raw))]


def _parse(body: bytes) -> ExportTraceServiceRequest:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    return msg


def test_an_otlp_json_body_with_content_is_forwarded_as_protobuf_without_it(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    seen, transport = _upstream()
    sc = start_sidecar(forward_otlp="http://collector:4318", forward_transport=transport)
    doc = MessageToDict(_parse(relabel(_with_content(export_body), "json")[0]))
    for rs in doc["resourceSpans"]:  # OTLP/JSON writes ids as hex
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in span:
                        span[k] = base64.b64decode(span[k]).hex()
    body = json.dumps(doc).encode()
    assert CANARY.encode() in body
    assert post(sc.otlp, body, "application/json").status_code == 200
    wait_for(lambda: len(seen) == 1, what="forwarded body")
    assert seen[0].headers["Content-Type"] == "application/x-protobuf"
    forwarded = _decoded(seen[0])
    assert len(_spans(forwarded)) == 64
    assert CANARY.encode() not in forwarded.SerializeToString()


def test_content_received_over_grpc_is_stripped_too(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    seen, transport = _upstream()
    sc = start_sidecar(forward_otlp="http://collector:4318", forward_transport=transport)
    body, _ = relabel(_with_content(export_body), "grpc")
    with grpc.insecure_channel(sc.grpc_target) as ch:
        ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)(
            body, timeout=10
        )
    wait_for(lambda: len(seen) == 1, what="forwarded body")
    assert CANARY.encode() not in seen[0].content
    assert len(_spans(_decoded(seen[0]))) == 64


def test_opting_in_forwards_content_byte_for_byte(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    seen, transport = _upstream()
    sc = start_sidecar(forward_otlp="http://collector:4318", forward_transport=transport,
                       forward_content=True)  # fmt: skip
    body = gzip.compress(relabel(_with_content(export_body), "optin")[0])
    assert post(sc.otlp, body, **{"Content-Encoding": "gzip"}).status_code == 200
    wait_for(lambda: len(seen) == 1, what="forwarded body")
    assert seen[0].content == body


def test_forward_content_is_a_config_key_and_an_environment_variable() -> None:
    assert load_config(env={}).forward_content is False
    assert load_config(env={"SLOKIT_FORWARD_CONTENT": "true"}).forward_content is True
    assert load_config(env={}, flags={"forward_content": True}).forward_content is True


@pytest.mark.parametrize("key", CONTENT_KEYS)
def test_content_attribute_names(key: str) -> None:
    assert is_content_attribute(key)


@pytest.mark.parametrize("key", KEPT_KEYS)
def test_look_alike_attribute_names_are_not_content(key: str) -> None:
    assert not is_content_attribute(key)


@pytest.mark.parametrize("name", CONTENT_EVENTS)
def test_content_event_names(name: str) -> None:
    assert is_content_event(name)


def test_a_body_without_content_is_passed_through_untouched(export_body: bytes) -> None:
    body = gzip.compress(export_body)
    assert without_content(body, "application/x-protobuf", "gzip", max_bytes=1 << 26) == (
        body, "application/x-protobuf", "gzip",
    )  # fmt: skip


def test_a_body_that_names_content_words_only_as_values_is_passed_through(
    export_body: bytes,
) -> None:
    msg = _parse(export_body)
    span = _spans(msg)[0]
    span.attributes.append(KeyValue(key="note"))
    span.attributes[-1].value.string_value = "mentions gen_ai.prompt in passing"
    body = msg.SerializeToString()
    assert without_content(body, "application/x-protobuf", None, max_bytes=1 << 26)[0] == body
