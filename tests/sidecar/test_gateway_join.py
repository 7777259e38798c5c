"""Gateway spans join their request by id or by trace, exported by the OpenTelemetry SDK.

Shapes: Envoy's (``guid:x-request-id``, ``upstream_address``, ``http.status_code``), the llm-d
router's (``gateway.request`` with no request id, its ``pick_endpoints`` child), each arriving
before and after vLLM's ``llm_request`` span; a 429 answered by the gateway alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from sidecar_harness import Running, StartSidecar

T0 = time.time_ns() - 60 * 10**9
MS = 10**6


def _tracer(sc: Running, pod: str) -> trace.Tracer:
    provider = TracerProvider(resource=Resource.create({"k8s.pod.name": pod}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sc.otlp)))
    return provider.get_tracer("test")


def _vllm(sc: Running, ctx: trace.Context, rid: str) -> None:
    span = _tracer(sc, "engine-0").start_span("llm_request", ctx, SpanKind.SERVER,
                                              start_time=T0 + 5 * MS)  # fmt: skip
    span.set_attributes({
        "gen_ai.request.id": rid, "gen_ai.latency.e2e": 0.5, "gen_ai.latency.time_in_queue": 0.1,
        "gen_ai.latency.time_in_model_prefill": 0.1, "gen_ai.latency.time_in_model_decode": 0.25,
        "gen_ai.usage.completion_tokens": 10,
    })  # fmt: skip
    span.end(T0 + 505 * MS)


Shape = Callable[[Running, str], trace.Context]


def _envoy(sc: Running, rid: str) -> trace.Context:
    span = _tracer(sc, "gw-pod-0").start_span("ingress", kind=SpanKind.SERVER, start_time=T0)
    span.set_attributes({"guid:x-request-id": rid, "upstream_address": "engine-0:8000",
                         "upstream_cluster": "vllm", "http.status_code": "200"})  # fmt: skip
    span.end(T0 + 600 * MS)
    return trace.set_span_in_context(span)


def _router(sc: Running, rid: str) -> trace.Context:
    tracer = _tracer(sc, "gw-pod-0")
    root = tracer.start_span("gateway.request", kind=SpanKind.SERVER, start_time=T0)
    root.set_attribute("http.response.status_code", 200)
    ctx = trace.set_span_in_context(root)
    pick = tracer.start_span("pick_endpoints", ctx, SpanKind.INTERNAL, start_time=T0 + 1 * MS)
    pick.end(T0 + 4 * MS)
    root.end(T0 + 600 * MS)
    return ctx


def _explain(sc: Running, rid: str) -> dict[str, object]:
    doc: dict[str, object] = httpx.get(f"{sc.api}/api/explain/{rid}", timeout=10).json()
    return doc


@pytest.mark.parametrize("shape", [_envoy, _router], ids=["envoy", "llm-d-router"])
@pytest.mark.parametrize("vllm_first", [False, True], ids=["gateway-first", "vllm-first"])
def test_gateway_span_joins_its_request(
    start_sidecar: StartSidecar, shape: Shape, vllm_first: bool
) -> None:
    sc = start_sidecar()
    rid = f"req-{shape.__name__.strip('_')}-{int(vllm_first)}"
    if vllm_first:
        # The gateway's span context first (not exported until it ends), vLLM's span in it.
        tracer = _tracer(sc, "gw-pod-0")
        parent = tracer.start_span("probe", kind=SpanKind.INTERNAL)
        ctx = trace.set_span_in_context(parent)
        _vllm(sc, ctx, rid)
        with trace.use_span(parent, end_on_exit=False):
            shape(sc, rid)
    else:
        ctx = shape(sc, rid)
        _vllm(sc, ctx, rid)
    doc = _explain(sc, rid)
    assert doc["replica"] == "engine-0"
    assert sorted(doc["sources"]) == ["gateway", "vllm"]  # type: ignore[arg-type]
    gw = doc["gateway"]
    assert isinstance(gw, dict)
    assert gw["http_status"] == 200
    assert gw["gateway_e2e_s"] == pytest.approx(0.6)
    assert gw["gateway_s"] == pytest.approx(0.1)
    if shape is _router:
        assert gw["routing_s"] == pytest.approx(0.003)
    assert sc.value("slokit_spans_unjoined_total", reason="expired") == 0


def test_gateway_only_rejection_never_counts_the_gateway_pod(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar()
    span = _tracer(sc, "gw-pod-0").start_span("ingress", kind=SpanKind.SERVER, start_time=T0)
    span.set_attributes({"guid:x-request-id": "req-429", "http.status_code": "429",
                         "upstream_cluster": "vllm"})  # fmt: skip
    span.end(T0 + 2 * MS)
    doc = _explain(sc, "req-429")
    assert doc["replica"] is None and doc["status"] == "rejected"
    gw = doc["gateway"]
    assert isinstance(gw, dict) and gw["http_status"] == 429
    text = httpx.get(f"{sc.api}/metrics", timeout=10).text
    deadline = time.time() + 10
    while "slokit_requests_total{" not in text and time.time() < deadline:
        time.sleep(0.2)
        text = httpx.get(f"{sc.api}/metrics", timeout=10).text
    assert "slokit_requests_total{" in text
    assert "gw-pod-0" not in text
