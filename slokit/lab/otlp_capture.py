"""A minimal OTLP/HTTP traces receiver for tests and experiments against real vLLM.

It keeps every ``POST /v1/traces`` body exactly as received (protobuf, maybe gzip) and answers
200 with an empty ``ExportTraceServiceResponse``. It validates nothing: it is a capture, not
slokit's receiver.

With ``forward_to`` it is a tee, as a collector fanning out to two exporters: each body is kept
and also sent on, as received (its content type and encoding with it), to that OTLP/HTTP
endpoint, whose answer (status, type, body) is the capture's; an endpoint that cannot be
reached is a 502. The body is kept whatever the answer, so a sender's retry is kept twice.

    with OtlpHttpCapture() as capture:
        ...  # vllm --otlp-traces-endpoint capture.endpoint (http/protobuf)
        spans = capture.wait_for(lambda spans: len(spans) >= 5)
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

#: What a tee sends on with a body: what the receiver needs to read it, and its credentials.
_FORWARDED_HEADERS = frozenset({"content-type", "content-encoding", "authorization"})

# A received span with its resource attributes as plain values.
CapturedSpan = tuple[dict[str, Any], "Span"]


@dataclass(frozen=True)
class CapturedPost:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes  # as received (maybe gzip)

    def payload(self) -> bytes:
        """The body with any gzip content-encoding undone."""
        if self.headers.get("content-encoding", "").lower() == "gzip":
            return gzip.decompress(self.body)
        return self.body


class OtlpHttpCapture:
    """Minimal OTLP/HTTP traces receiver: keeps each POST /v1/traces, answers 200."""

    def __init__(self, host: str = "127.0.0.1", *, forward_to: str | None = None) -> None:
        self.posts: list[CapturedPost] = []
        self.forward_to = forward_to
        self._lock = threading.Lock()
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                headers = {name.lower(): value for name, value in self.headers.items()}
                with capture._lock:
                    capture.posts.append(CapturedPost(self.path, headers, body))
                if capture.forward_to is not None:
                    self._forward(capture.forward_to, headers, body)
                    return
                # An empty ExportTraceServiceResponse serializes to zero bytes.
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _forward(self, url: str, headers: dict[str, str], body: bytes) -> None:
                sent = {k: v for k, v in headers.items() if k in _FORWARDED_HEADERS}
                try:
                    answer = httpx.post(url, content=body, headers=sent, timeout=30)
                except httpx.HTTPError as exc:
                    self.send_error(502, f"forwarding to {url}: {exc}")
                    return
                self.send_response(answer.status_code)
                for name in ("content-type", "retry-after"):
                    if name in answer.headers:
                        self.send_header(name, answer.headers[name])
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"

    def start(self) -> OtlpHttpCapture:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpHttpCapture:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def snapshot(self) -> list[CapturedPost]:
        with self._lock:
            return list(self.posts)

    def spans(self) -> list[CapturedSpan]:
        """Every span received so far, each with its resource attributes as plain values."""
        # deferred: protobuf and the OTLP messages load only when spans are decoded
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        found: list[CapturedSpan] = []
        for post in self.snapshot():
            request = ExportTraceServiceRequest.FromString(post.payload())
            for resource_spans in request.resource_spans:
                resource = attributes_dict(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    found.extend((resource, span) for span in scope_spans.spans)
        return found

    def wait_for(
        self,
        done: Callable[[list[CapturedSpan]], bool],
        timeout_s: float = 15.0,
    ) -> list[CapturedSpan]:
        """Poll ``spans()`` until ``done(spans)`` (vLLM exports in batches); return them."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.2)


def attributes_dict(attributes: Any) -> dict[str, Any]:
    """OTLP KeyValue list -> {key: python value} (string, int, double or bool)."""
    values: dict[str, Any] = {}
    for attribute in attributes:
        kind = attribute.value.WhichOneof("value")
        values[attribute.key] = getattr(attribute.value, kind) if kind else None
    return values
