"""OTLP/gRPC receiver: vLLM's default protocol, through the real OpenTelemetry exporters."""

from __future__ import annotations

import threading

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind
from sidecar_harness import StartSidecar, relabel, request_ids

from slokit.sidecar.otlp_grpc import METHOD


def _export(target: str, body: bytes, timeout: float = 10.0) -> bytes:
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        return bytes(call(body, timeout=timeout))


def _send_llm_request(exporter: SpanExporter, request_id: str) -> None:
    """One span shaped like vLLM's ``llm_request``, sent by the real SDK exporter."""
    provider = TracerProvider(resource=Resource.create({"k8s.pod.name": "vllm-0"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.tracing.otel")
    with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER) as span:
        span.set_attribute("gen_ai.request.id", f"cmpl-{request_id}-0")
        span.set_attribute("gen_ai.latency.time_in_queue", 0.01)
        span.set_attribute("gen_ai.latency.e2e", 0.5)
        span.set_attribute("gen_ai.usage.completion_tokens", 20)
    provider.shutdown()


def test_real_vllm_export_over_grpc_is_kept_before_ok(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar()
    out = ExportTraceServiceResponse()
    out.ParseFromString(_export(sc.grpc_target, export_body))
    assert not out.HasField("partial_success")
    assert {f"r{i}" for i in range(64)} <= request_ids(sc)
    assert sc.value("slokit_spans_received_total", protocol="grpc") == 64
    assert sc.value("slokit_otlp_requests_total", protocol="grpc", code="OK") == 1


def test_the_opentelemetry_grpc_exporter_delivers_spans(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar()
    _send_llm_request(GrpcExporter(endpoint=sc.grpc_target, insecure=True), "sdk-grpc")
    assert "sdk-grpc" in request_ids(sc)


def test_the_opentelemetry_http_exporter_delivers_spans(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar()
    _send_llm_request(HttpExporter(endpoint=sc.otlp), "sdk-http")
    assert "sdk-http" in request_ids(sc)


def test_undecodable_message_is_invalid_argument(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar()
    with pytest.raises(grpc.RpcError) as err:
        _export(sc.grpc_target, b"\x0a\xff\xff\xff\xff\x0fnot protobuf")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_full_queue_is_unavailable_so_the_client_retries(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    release = threading.Event()
    sc = start_sidecar(queue_capacity=64, before_commit=lambda: release.wait(10))
    try:
        first, _ = relabel(export_body, "a")
        second, _ = relabel(export_body, "b")
        t = threading.Thread(target=_export, args=(sc.grpc_target, first))
        t.start()
        while sc.sidecar.writer is not None and sc.sidecar.writer.depth == 0:
            pass
        with pytest.raises(grpc.RpcError) as err:
            _export(sc.grpc_target, second)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        release.set()
    t.join(10)
    assert sc.value("slokit_otlp_requests_total", protocol="grpc", code="UNAVAILABLE") == 1


def test_a_call_of_two_messages_is_refused_and_keeps_neither(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    """OTLP's Export is unary; a client streaming two messages once got OK for both while
    the second was never read."""
    sc = start_sidecar()
    first, first_ids = relabel(export_body, "two-1")
    second, second_ids = relabel(export_body, "two-2")
    with grpc.insecure_channel(sc.grpc_target) as ch:
        call = ch.stream_unary(METHOD, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            call(iter([first, second]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "one message" in (err.value.details() or "")
    assert not (set(first_ids) | set(second_ids)) & request_ids(sc)
    assert sc.value("slokit_otlp_requests_total", protocol="grpc", code="INVALID_ARGUMENT") == 1
