"""OTLP decoding against the real vLLM 0.32 exports and malformed bodies."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from slokit.errors import BadInput
from slokit.sources.otlp import (
    PayloadTooLarge,
    UnsupportedMediaType,
    decode_traces,
    decompress,
    inflated_size,
    parse_request,
)


def _export(vllm_fixtures: Path, n: int) -> bytes:
    return (vllm_fixtures / "otlp" / f"export_{n:02d}.pb").read_bytes()


def _span_attrs(body: bytes) -> dict[str, dict[str, object]]:
    """request id -> attributes, read independently of slokit with protobuf's JSON mapping."""
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    out: dict[str, dict[str, object]] = {}
    for rs in MessageToDict(msg)["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                attrs = {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}
                out[str(attrs["gen_ai.request.id"])] = attrs | {"_start": span["startTimeUnixNano"]}
    return out


def test_llm_request_spans_become_vllm_fragments_with_every_latency(vllm_fixtures: Path) -> None:
    body = _export(vllm_fixtures, 6)
    decoded = decode_traces(body)
    assert decoded.spans == 64 and len(decoded.fragments) == 64 and decoded.rejected == 0
    expected = _span_attrs(body)["cmpl-r24-0"]
    frag = next(f for f in decoded.fragments if f.request_id == "r24")
    assert frag.source == "vllm"
    assert frag.ttft_s == expected["gen_ai.latency.time_to_first_token"]
    assert frag.e2e_s == expected["gen_ai.latency.e2e"]
    assert frag.queue_s == expected["gen_ai.latency.time_in_queue"]
    assert frag.prefill_s == expected["gen_ai.latency.time_in_model_prefill"]
    assert frag.decode_s == expected["gen_ai.latency.time_in_model_decode"]
    assert frag.inference_s == expected["gen_ai.latency.time_in_model_inference"]
    assert frag.prompt_tokens == int(str(expected["gen_ai.usage.prompt_tokens"]))
    assert frag.output_tokens == int(str(expected["gen_ai.usage.completion_tokens"]))
    assert frag.max_tokens == int(str(expected["gen_ai.request.max_tokens"]))
    assert frag.arrival_ts == pytest.approx(int(str(expected["_start"])) / 1e9)


def test_startup_spans_are_skipped_not_rejected(vllm_fixtures: Path) -> None:
    decoded = decode_traces(_export(vllm_fixtures, 2))
    assert decoded.fragments == [] and decoded.skipped == 6 and decoded.rejected == 0


def test_replica_defaults_to_configured_name_over_process_instance_id(vllm_fixtures: Path) -> None:
    decoded = decode_traces(_export(vllm_fixtures, 6), default_replica="pod-a")
    assert {f.replica for f in decoded.fragments} == {"pod-a"}


def test_replica_falls_back_to_service_instance_id(vllm_fixtures: Path) -> None:
    decoded = decode_traces(_export(vllm_fixtures, 6))
    assert {f.replica for f in decoded.fragments} == {"b9ff1080-fd61-4b5f-a6d6-e0b42a241a05"}


def test_gzip_body_decodes_like_the_plain_one(vllm_fixtures: Path) -> None:
    body = _export(vllm_fixtures, 6)
    plain = decode_traces(body)
    zipped = decode_traces(gzip.compress(body), content_encoding="gzip")
    assert [f.fragment_id for f in zipped.fragments] == [f.fragment_id for f in plain.fragments]


def _to_otlp_json(body: bytes) -> bytes:
    """OTLP/JSON as the spec writes it: hex ids, camelCase keys."""
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    doc = MessageToDict(msg)
    import base64

    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in span:
                        span[k] = base64.b64decode(span[k]).hex()
    return json.dumps(doc).encode()


def test_otlp_json_with_hex_ids_decodes_like_protobuf(vllm_fixtures: Path) -> None:
    body = _export(vllm_fixtures, 6)
    from_pb = decode_traces(body)
    from_json = decode_traces(_to_otlp_json(body), "application/json")
    assert [(f.request_id, f.trace_id, f.ttft_s) for f in from_json.fragments] == [
        (f.request_id, f.trace_id, f.ttft_s) for f in from_pb.fragments
    ]


def test_truncated_protobuf_is_bad_input(vllm_fixtures: Path) -> None:
    with pytest.raises(BadInput, match="undecodable OTLP protobuf"):
        decode_traces(_export(vllm_fixtures, 6)[:-7])


def test_broken_json_is_bad_input() -> None:
    with pytest.raises(BadInput, match="undecodable OTLP JSON"):
        decode_traces(b'{"resourceSpans": [', "application/json")


def test_a_json_number_past_pythons_digit_limit_is_bad_input() -> None:
    with pytest.raises(BadInput, match="undecodable OTLP JSON"):
        decode_traces(b'{"resourceSpans": [], "x": ' + b"1" * 5000 + b"}", "application/json")


def test_invalid_utf8_json_is_bad_input() -> None:
    with pytest.raises(BadInput):
        decode_traces(b'{"resourceSpans": "\xff\xfe"}', "application/json")


def test_unknown_content_type_is_unsupported_media_type() -> None:
    with pytest.raises(UnsupportedMediaType):
        decode_traces(b"x", "text/plain")


def test_gzip_bomb_stops_at_the_limit_without_inflating_it_all() -> None:
    bomb = gzip.compress(b"\0" * (8 * 1024 * 1024))
    with pytest.raises(PayloadTooLarge):
        decompress(bomb, "gzip", max_bytes=1024 * 1024)


def test_corrupt_gzip_is_bad_input() -> None:
    with pytest.raises(BadInput, match=r"(corrupt|truncated) gzip"):
        decompress(b"\x1f\x8b\x08\x00garbage", "gzip", max_bytes=1024)


# -- inflated_size: what the sidecar's body budget holds for a compressed body -----------

#: Several INFLATE_STEPs of bytes that do not repeat within zlib's window.
PAYLOAD = bytes(range(256)) * 12_289 + b"tail"


@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        (gzip.compress(PAYLOAD), "gzip"),
        (gzip.compress(PAYLOAD), "x-gzip"),
        (gzip.compress(PAYLOAD[:1000]) + gzip.compress(PAYLOAD), "gzip"),  # two members
        (zlib.compress(PAYLOAD), "deflate"),
        (PAYLOAD, None),
        (PAYLOAD, " Identity "),
        (gzip.compress(b""), "gzip"),
    ],
    ids=["gzip", "x-gzip", "two-gzip-members", "deflate", "plain", "identity", "empty"],
)
def test_inflated_size_is_the_length_decompress_returns(body: bytes, encoding: str | None) -> None:
    assert inflated_size(body, encoding, 64 * 1024 * 1024) == len(
        decompress(body, encoding, 64 * 1024 * 1024)
    )


def test_inflated_size_refuses_a_body_past_the_limit_as_decompress_does() -> None:
    bomb = gzip.compress(b"\0" * (8 * 1024 * 1024))
    assert inflated_size(bomb, "gzip", 8 * 1024 * 1024) == 8 * 1024 * 1024
    with pytest.raises(PayloadTooLarge):
        inflated_size(bomb, "gzip", 8 * 1024 * 1024 - 1)


def test_inflated_size_refuses_a_truncated_or_unknown_encoding() -> None:
    with pytest.raises(BadInput, match="truncated gzip"):
        inflated_size(gzip.compress(PAYLOAD)[:-100], "gzip", 64 * 1024 * 1024)
    with pytest.raises(BadInput, match="unsupported Content-Encoding"):
        inflated_size(PAYLOAD, "br", 64 * 1024 * 1024)


def test_decompress_keeps_the_bytes_that_inflated_size_counts() -> None:
    body = gzip.compress(PAYLOAD[:5000]) + gzip.compress(PAYLOAD)
    assert decompress(body, "gzip", 64 * 1024 * 1024) == PAYLOAD[:5000] + PAYLOAD


def test_span_with_empty_trace_id_is_rejected_and_counted(vllm_fixtures: Path) -> None:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(_export(vllm_fixtures, 6))
    spans = msg.resource_spans[0].scope_spans[0].spans
    spans[0].trace_id = b""
    spans[1].trace_id = b"\0" * 16
    decoded = decode_traces(msg.SerializeToString())
    assert decoded.rejected == 2 and len(decoded.fragments) == 62
    assert decoded.rejection_reasons == {"empty or malformed trace id": 2}


def test_gateway_server_span_with_request_header_becomes_gateway_fragment() -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    msg = ExportTraceServiceRequest()
    rs = msg.resource_spans.add()
    rs.resource.attributes.add(key="k8s.pod.name", value=AnyValue(string_value="gw-1"))
    span = rs.scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x01" * 16, b"\x02" * 8, "POST /v1/chat/completions"
    span.kind = Span.SPAN_KIND_SERVER
    span.start_time_unix_nano, span.end_time_unix_nano = 10**18, 10**18 + 1_500_000_000
    span.attributes.extend(
        [
            KeyValue(
                key="http.request.header.x-request-id",
                value=AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="abc")])),
            ),
            KeyValue(key="http.response.status_code", value=AnyValue(int_value=503)),
            KeyValue(key="gen_ai.usage.input_tokens", value=AnyValue(int_value=12)),
            KeyValue(key="gen_ai.prompt", value=AnyValue(string_value="SECRET PROMPT")),
        ]
    )
    (frag,) = decode_traces(msg.SerializeToString()).fragments
    # The gateway's own pod (its resource) is never the replica: the span names no upstream.
    assert (frag.request_id, frag.source, frag.replica) == ("abc", "gateway", None)
    assert (frag.http_status, frag.status, frag.prompt_tokens) == (503, "error", 12)
    assert frag.gateway_e2e_s == pytest.approx(1.5)
    assert "SECRET" not in repr(frag)


def test_gzip_with_flipped_bytes_is_bad_input() -> None:
    data = bytearray(gzip.compress(bytes(range(256)) * 64))
    data[20:30] = b"\xff" * 10
    with pytest.raises(BadInput, match=r"(corrupt|truncated) gzip"):
        decompress(bytes(data), "gzip", max_bytes=1 << 20)


def _client_span(status: str | None, *, error: bool) -> bytes:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

    msg = ExportTraceServiceRequest()
    span = msg.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x03" * 16, b"\x04" * 8, "POST"
    span.kind = Span.SPAN_KIND_CLIENT
    span.start_time_unix_nano, span.end_time_unix_nano = 10**18, 10**18 + 2_000_000_000
    if error:
        span.status.code = Status.STATUS_CODE_ERROR
    span.attributes.append(KeyValue(key="slokit.request_id", value=AnyValue(string_value="r9")))
    if status is not None:
        span.attributes.append(KeyValue(key="slokit.status", value=AnyValue(string_value=status)))
    return msg.SerializeToString()


@pytest.mark.parametrize("declared", ["incomplete", "cancelled"])
def test_a_client_span_declaring_its_own_outcome_keeps_it_over_the_error_status(
    declared: str,
) -> None:
    (frag,) = decode_traces(_client_span(declared, error=True)).fragments
    assert (frag.source, frag.status) == ("client", declared)


def test_a_client_span_cannot_declare_a_server_outcome() -> None:
    (frag,) = decode_traces(_client_span("ok", error=True)).fragments
    assert frag.status == "error"


@pytest.mark.parametrize("depth", [300, 100_000], ids=["past-the-limit", "past-python-recursion"])
def test_otlp_json_nested_too_deep_is_bad_input(depth: int) -> None:
    body = b'{"resourceSpans": ' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(BadInput, match="nested"):
        decode_traces(body, "application/json")


def test_otlp_json_hex_ids_become_the_spans_ids(vllm_fixtures: Path) -> None:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(_export(vllm_fixtures, 6))
    doc = MessageToDict(msg)
    spans = [s for r in msg.resource_spans for ss in r.scope_spans for s in ss.spans]
    for span, d in zip(spans, (d for r in doc["resourceSpans"] for ss in r["scopeSpans"]
                               for d in ss["spans"]), strict=True):  # fmt: skip
        d["traceId"], d["spanId"] = span.trace_id.hex(), span.span_id.hex()
        d.pop("parentSpanId", None)
        span.ClearField("parent_span_id")
    got = parse_request(json.dumps(doc).encode(), "application/json")
    assert got == msg
