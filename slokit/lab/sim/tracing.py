"""vLLM's ``llm_request`` OTLP span, sent with the OpenTelemetry SDK.

One :class:`SpanEmitter` per replica: its own ``TracerProvider`` whose Resource carries
``service.name``, ``k8s.pod.name`` (the replica's name) and ``service.instance.id``
(plus vLLM's ``vllm.instrumenting_module_name`` / ``vllm.process_id``), a
``BatchSpanProcessor`` and an OTLP exporter (``grpc`` or ``http/protobuf``, as vLLM's
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``). The span is named ``llm_request``, kind SERVER,
instrumentation scope ``vllm.tracing.otel``, starts at the request's arrival, ends at
its finish, is parented on the caller's ``traceparent`` and has vLLM's attributes with
vLLM's types (doubles for latencies and sampling parameters, ints for counts).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

from slokit.lab.sim.engine import SimRequest

SCOPE = "vllm.tracing.otel"
SPAN_NAME = "llm_request"


def span_attributes(req: SimRequest, span_request_id: str) -> dict[str, Any]:
    """vLLM's ``llm_request`` attributes for a finished request, in vLLM's order."""
    first = req.first_token_time
    last = req.last_token_time or first
    sched = req.scheduled_time
    attrs: dict[str, Any] = {}
    if first is not None:
        attrs["gen_ai.latency.time_to_first_token"] = float(first - req.arrival_time)
    if req.finish_time is not None:
        attrs["gen_ai.latency.e2e"] = float(req.finish_time - req.arrival_time)
    if sched is not None:
        attrs["gen_ai.latency.time_in_queue"] = float(sched - req.queued_time)
    attrs["gen_ai.usage.prompt_tokens"] = int(req.num_prompt_tokens)
    attrs["gen_ai.usage.completion_tokens"] = int(req.num_output)
    if sched is not None and first is not None and last is not None:
        attrs["gen_ai.latency.time_in_model_prefill"] = float(first - sched)
        attrs["gen_ai.latency.time_in_model_decode"] = float(last - first)
        attrs["gen_ai.latency.time_in_model_inference"] = float(last - sched)
    attrs["gen_ai.request.id"] = span_request_id
    attrs["gen_ai.request.top_p"] = float(req.top_p)
    attrs["gen_ai.request.max_tokens"] = int(req.max_tokens)
    attrs["gen_ai.request.temperature"] = float(req.temperature)
    attrs["gen_ai.request.n"] = int(req.n)
    return attrs


def make_exporter(endpoint: str, protocol: str) -> Any:
    """An OTLP span exporter for ``endpoint``; ``protocol`` is grpc or http/protobuf."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        target = endpoint.split("://", 1)[-1]
        return OTLPSpanExporter(endpoint=target, insecure=True)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        url = (
            endpoint
            if endpoint.rstrip("/").endswith("/v1/traces")
            else endpoint.rstrip("/") + "/v1/traces"
        )
        if "://" not in url:
            url = "http://" + url
        return HttpExporter(endpoint=url)
    raise ValueError(f"unknown OTLP protocol {protocol!r} (grpc or http/protobuf)")


class SpanEmitter:
    """Emits ``llm_request`` spans for one replica through its own TracerProvider."""

    def __init__(
        self,
        exporter: Any,
        pod_name: str,
        service_name: str = "vllm",
        batch: bool = True,
    ):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create(
            {
                "service.name": service_name,
                "k8s.pod.name": pod_name,
                "service.instance.id": str(uuid.uuid4()),
                "vllm.instrumenting_module_name": "vllm.llm_engine",
                "vllm.process_id": str(os.getpid()),
            }
        )
        self.provider = TracerProvider(resource=resource)
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer(SCOPE)
        self._propagator = TraceContextTextMapPropagator()
        self._kind = SpanKind.SERVER

    def parent_context(self, headers: Mapping[str, str]) -> Any:
        """The OpenTelemetry context of an incoming ``traceparent`` (None without one)."""
        tp = headers.get("traceparent")
        if not tp:
            return None
        carrier = {"traceparent": tp}
        if headers.get("tracestate"):
            carrier["tracestate"] = headers["tracestate"]
        return self._propagator.extract(carrier)

    def emit(self, req: SimRequest, span_request_id: str, parent: Any) -> None:
        end = req.finish_time if req.finish_time is not None else req.arrival_time
        span = self.tracer.start_span(
            SPAN_NAME,
            context=parent,
            kind=self._kind,
            start_time=int(req.arrival_time * 1e9),
            attributes=span_attributes(req, span_request_id),
        )
        span.end(end_time=int(end * 1e9))

    def shutdown(self) -> None:
        self.provider.shutdown()
