"""Synthetic but wire-exact vLLM ``llm_request`` spans for benchmarks."""

from __future__ import annotations

import random
import secrets
import uuid

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from slokit.records import RequestFragment


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def llm_request_export(
    n: int,
    *,
    start_index: int = 0,
    seed: int = 0,
    replica: str = "pod-a",
    t0: float = 1_795_958_000.0,
    random_ids: bool = False,
) -> bytes:
    """One ExportTraceServiceRequest body holding ``n`` llm_request spans like vLLM 0.32's.

    Request ids are ``cmpl-req-<index>-0`` (sequential), or with ``random_ids`` as vLLM's
    OpenAI server makes them, ``cmpl-<32 hex>-0`` (``random_uuid()``; drawn from the seeded
    generator, so a rerun sends the same ones): random keys land anywhere in the store's
    indexes, which then take several times the memory sequential ones do."""
    rng = random.Random(seed + start_index)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(
        [
            _kv("service.name", "vllm"),
            _kv("k8s.pod.name", replica),
            _kv("telemetry.sdk.language", "python"),
        ]
    )
    ss = rs.scope_spans.add()
    ss.scope.name = "vllm.tracing.otel"
    for i in range(start_index, start_index + n):
        queue = rng.expovariate(20)
        prefill = rng.uniform(0.01, 0.2)
        out = rng.randint(16, 512)
        decode = out * rng.uniform(0.01, 0.03)
        ttft = queue + prefill
        e2e = ttft + decode
        arrival = t0 + i * 0.01
        span = ss.spans.add()
        span.trace_id = rng.randbytes(16)
        span.span_id = rng.randbytes(8)
        span.name = "llm_request"
        span.kind = Span.SPAN_KIND_SERVER
        span.start_time_unix_nano = int(arrival * 1e9)
        span.end_time_unix_nano = int((arrival + e2e) * 1e9)
        span.attributes.extend(
            [
                _kv("gen_ai.latency.time_to_first_token", ttft),
                _kv("gen_ai.latency.e2e", e2e),
                _kv("gen_ai.latency.time_in_queue", queue),
                _kv("gen_ai.usage.prompt_tokens", rng.randint(16, 2048)),
                _kv("gen_ai.usage.completion_tokens", out),
                _kv("gen_ai.latency.time_in_model_prefill", prefill),
                _kv("gen_ai.latency.time_in_model_decode", decode),
                _kv("gen_ai.latency.time_in_model_inference", prefill + decode),
                _kv(
                    "gen_ai.request.id",
                    f"cmpl-{rng.randbytes(16).hex()}-0" if random_ids else f"cmpl-req-{i}-0",
                ),
                _kv("gen_ai.request.top_p", 1.0),
                _kv("gen_ai.request.max_tokens", out),
                _kv("gen_ai.request.temperature", 1.0),
                _kv("gen_ai.request.n", 1),
            ]
        )
    return req.SerializeToString()


def new_vllm_fragments(n: int, arrival_ts: float) -> list[RequestFragment]:
    """``n`` vLLM fragments of new requests, with random request, span and trace ids (as a
    sidecar's store sees them: every key lands anywhere in its indexes)."""
    return [
        RequestFragment(
            request_id=str(uuid.uuid4()),
            source="vllm",
            fragment_id="vllm:" + secrets.token_hex(8),
            trace_id=secrets.token_hex(16),
            replica="pod-a",
            arrival_ts=arrival_ts,
            ttft_s=0.2,
            e2e_s=1.0,
            queue_s=0.01,
            prefill_s=0.05,
            decode_s=0.9,
            prompt_tokens=100,
            output_tokens=50,
        )
        for _ in range(n)
    ]
