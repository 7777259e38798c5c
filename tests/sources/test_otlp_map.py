"""The decoder's view of an OTLP export (span attributes as a map) holds what was sent.

The view is parsed from the same bytes as OpenTelemetry's own message; these tests hold it to
that: every field and every attribute of every span as sent (real vLLM captures, LiteLLM's
spans and spans built here), and a key sent twice keeps its last value.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToJson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_validation import NOW, _set, vllm_export

from slokit.sources.otlp import decode_traces, parse_request, parse_spans

GATEWAY = Path(__file__).resolve().parents[1] / "fixtures" / "gateway"


def _bodies(vllm_fixtures: Path) -> list[tuple[bytes, str]]:
    pb = sorted((vllm_fixtures / "otlp").glob("*.pb"))
    litellm = sorted(GATEWAY.glob("*.json"))
    assert pb and litellm
    return [(p.read_bytes(), "application/x-protobuf") for p in pb] + [
        (p.read_bytes(), "application/json") for p in litellm
    ]


def _without_attributes(span: Any) -> dict[str, Any]:
    fields = {fd.name: value for fd, value in span.ListFields() if fd.name != "attributes"}
    return {k: v.SerializeToString() if hasattr(v, "SerializeToString") else v
            for k, v in fields.items()}  # fmt: skip


def _pairs(otel: ExportTraceServiceRequest, view: Any) -> list[tuple[Any, Any]]:
    out = []
    for rs_o, rs_v in zip(otel.resource_spans, view.resource_spans, strict=True):
        assert rs_o.resource.SerializeToString() == rs_v.resource.SerializeToString()
        for ss_o, ss_v in zip(rs_o.scope_spans, rs_v.scope_spans, strict=True):
            out += list(zip(ss_o.spans, ss_v.spans, strict=True))
    return out


def test_the_map_view_holds_every_span_as_sent(vllm_fixtures: Path) -> None:
    spans = 0
    for body, ct in _bodies(vllm_fixtures):
        for sent, view in _pairs(parse_request(body, ct), parse_spans(body, ct)):
            assert dict(view.attributes) == {kv.key: kv.value for kv in sent.attributes}
            assert _without_attributes(view) == _without_attributes(sent)
            spans += 1
    assert spans > 50  # every capture read, not an empty loop


def test_a_json_export_and_its_protobuf_give_the_same_view(vllm_fixtures: Path) -> None:
    body = (vllm_fixtures / "otlp" / "export_06.pb").read_bytes()
    as_json = json.loads(MessageToJson(ExportTraceServiceRequest.FromString(body)))
    for rs in as_json["resourceSpans"]:  # OTLP/JSON writes ids as hex, not base64
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    view = parse_spans(json.dumps(as_json).encode(), "application/json")
    assert view.SerializeToString(deterministic=True) == parse_spans(body).SerializeToString(
        deterministic=True
    )


def test_a_key_sent_twice_keeps_its_last_value() -> None:
    body = vllm_export({"gen_ai.latency.e2e": 1.0})
    msg = ExportTraceServiceRequest.FromString(body)
    kv = msg.resource_spans[0].scope_spans[0].spans[0].attributes.add()
    kv.key, kv.value.double_value = "gen_ai.latency.e2e", 2.0
    (frag,) = decode_traces(msg.SerializeToString(), now=NOW).fragments
    assert frag.e2e_s == 2.0


def _one_span(attrs: list[tuple[str, Any]]) -> bytes:
    """A vLLM export of one llm_request span whose attributes are ``attrs``, in that order."""
    msg = ExportTraceServiceRequest.FromString(vllm_export({}))
    span = msg.resource_spans[0].scope_spans[0].spans[0]
    del span.attributes[:]
    for key, value in [("gen_ai.request.id", "cmpl-o-0"), *attrs]:
        _set(span, key, value)
    return msg.SerializeToString()


VLLM_NAMES = [("gen_ai.usage.prompt_tokens", 10), ("gen_ai.usage.completion_tokens", 5)]
CURRENT_NAMES = [("gen_ai.usage.input_tokens", 20), ("gen_ai.usage.output_tokens", 7)]


@pytest.mark.parametrize(
    "attrs", [VLLM_NAMES + CURRENT_NAMES, CURRENT_NAMES + VLLM_NAMES],
    ids=["vllm's names first", "current names first"],
)  # fmt: skip
def test_vllms_token_names_win_over_the_current_ones_whatever_their_order(
    attrs: list[tuple[str, Any]],
) -> None:
    (frag,) = decode_traces(_one_span(attrs), now=NOW).fragments
    assert (frag.prompt_tokens, frag.output_tokens) == (10, 5)


def test_the_current_token_names_are_read_when_vllms_are_absent() -> None:
    (frag,) = decode_traces(_one_span(CURRENT_NAMES), now=NOW).fragments
    assert (frag.prompt_tokens, frag.output_tokens) == (20, 7)
