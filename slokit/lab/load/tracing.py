"""The load generator's OTLP client spans: one CLIENT span per request.

A span's ids are the ones the request sent in ``traceparent``, so the server's spans join
it. OpenTelemetry's SDK is imported when a tracer is made, not with this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from slokit import clientlog as cl
from slokit.errors import BadInput

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span


class ClientTracer:
    """Exports one CLIENT span per request through the OpenTelemetry SDK."""

    def __init__(self, exporter: SpanExporter, *, batch: bool) -> None:
        # deferred, here and below: OpenTelemetry (SDK, API, exporter) loads only when a run
        # exports spans
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        self._provider = TracerProvider(resource=Resource.create({"service.name": "slokit-load"}))
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("slokit.lab.load")

    def start(self, name: str, start_ts: float) -> Span:
        from opentelemetry.trace import SpanKind

        return self._tracer.start_span(name, kind=SpanKind.CLIENT, start_time=int(start_ts * 1e9))

    @staticmethod
    def finish(span: Span, attributes: dict[str, Any], end_ts: float, failed: bool) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if failed:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=int(end_ts * 1e9))

    def shutdown(self) -> None:
        self._provider.shutdown()


def operation_name(chat: bool) -> str:
    """The GenAI operation of a request: ``chat`` or ``text_completion``."""
    return "chat" if chat else "text_completion"


def request_span_attributes(
    rec: dict[str, Any], url: str, model: str, chat: bool
) -> dict[str, Any]:
    """The client span's attributes for a finished request's record (``None`` ones are
    dropped when set)."""
    return {
        "http.request.method": "POST",
        "http.response.status_code": rec[cl.HTTP_STATUS],
        "url.full": url,
        "gen_ai.operation.name": operation_name(chat),
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": rec[cl.MAX_TOKENS],
        "gen_ai.usage.input_tokens": rec[cl.PROMPT_TOKENS],
        "gen_ai.usage.output_tokens": rec[cl.OUTPUT_TOKENS],
        "slokit.request_id": rec[cl.REQUEST_ID],
        "slokit.slo_class": rec[cl.SLO_CLASS],
        "slokit.task_id": rec[cl.TASK_ID],
        "slokit.tenant": rec[cl.TENANT],
        "slokit.client.ttft_s": rec[cl.TTFT_S],
        "slokit.status": rec[cl.STATUS],
        "error.type": rec[cl.ERROR_TYPE],
    }


def otlp_http_exporter(endpoint: str) -> SpanExporter:
    """An OTLP/HTTP span exporter for ``endpoint`` (``/v1/traces`` when it names no path)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadInput(f"--otlp-endpoint must be an http(s) URL, got {endpoint!r}")
    if parts.path in ("", "/"):
        endpoint = urlunsplit(parts._replace(path="/v1/traces"))
    return OTLPSpanExporter(endpoint=endpoint)
