"""slokit.lab.otlp_capture: the receiver that vLLM-backed tests point traces at."""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from slokit.lab.otlp_capture import OtlpHttpCapture, attributes_dict
from slokit.lab.vllm_server import free_port


@pytest.fixture
def capture() -> Iterator[OtlpHttpCapture]:
    with OtlpHttpCapture() as receiver:
        yield receiver


def _export(request_id: str, pod: str = "pod-a") -> bytes:
    span = Span(
        name="llm_request",
        attributes=[
            KeyValue(key="gen_ai.request.id", value=AnyValue(string_value=request_id)),
            KeyValue(key="gen_ai.usage.prompt_tokens", value=AnyValue(int_value=7)),
        ],
    )
    resource_spans = ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])
    resource_spans.resource.attributes.append(
        KeyValue(key="k8s.pod.name", value=AnyValue(string_value=pod))
    )
    return ExportTraceServiceRequest(resource_spans=[resource_spans]).SerializeToString()


def _post(capture: OtlpHttpCapture, body: bytes, **headers: str) -> httpx.Response:
    headers = {"Content-Type": "application/x-protobuf", **headers}
    return httpx.post(capture.endpoint, content=body, headers=headers, timeout=5)


def test_endpoint_is_the_otlp_http_traces_path_on_loopback(capture: OtlpHttpCapture) -> None:
    assert capture.endpoint.startswith("http://127.0.0.1:")
    assert capture.endpoint.endswith("/v1/traces")


def test_a_post_is_answered_200_with_an_empty_export_response(capture: OtlpHttpCapture) -> None:
    response = _post(capture, _export("cmpl-r1-0"))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-protobuf"
    assert response.content == b""


def test_bodies_are_kept_as_received(capture: OtlpHttpCapture) -> None:
    body = gzip.compress(_export("cmpl-r1-0"))
    _post(capture, body, **{"Content-Encoding": "gzip"})
    (post,) = capture.snapshot()
    assert post.body == body
    assert post.payload() == _export("cmpl-r1-0")


def test_spans_decode_plain_and_gzip_bodies_with_their_resource(
    capture: OtlpHttpCapture,
) -> None:
    _post(capture, _export("cmpl-r1-0"))
    _post(
        capture, gzip.compress(_export("chatcmpl-r2", pod="pod-b")), **{"Content-Encoding": "gzip"}
    )
    spans = capture.spans()
    assert [
        (r["k8s.pod.name"], attributes_dict(s.attributes)["gen_ai.request.id"]) for r, s in spans
    ] == [
        ("pod-a", "cmpl-r1-0"),
        ("pod-b", "chatcmpl-r2"),
    ]


def test_other_paths_are_not_found_and_not_kept(capture: OtlpHttpCapture) -> None:
    response = httpx.post(capture.endpoint.replace("/v1/traces", "/v1/metrics"), content=b"x")
    assert response.status_code == 404
    assert capture.snapshot() == []


def test_attribute_values_become_plain_python_values() -> None:
    attributes = [
        KeyValue(key="s", value=AnyValue(string_value="x")),
        KeyValue(key="i", value=AnyValue(int_value=3)),
        KeyValue(key="d", value=AnyValue(double_value=0.5)),
        KeyValue(key="b", value=AnyValue(bool_value=True)),
    ]
    assert attributes_dict(attributes) == {"s": "x", "i": 3, "d": 0.5, "b": True}


def test_wait_for_returns_as_soon_as_the_condition_holds(capture: OtlpHttpCapture) -> None:
    _post(capture, _export("cmpl-r1-0"))
    spans = capture.wait_for(lambda spans: len(spans) == 1, timeout_s=5)
    assert len(spans) == 1


def test_wait_for_gives_up_after_the_timeout_with_what_it_has(capture: OtlpHttpCapture) -> None:
    assert capture.wait_for(lambda spans: len(spans) > 0, timeout_s=0.3) == []


@contextlib.contextmanager
def _refusing_receiver(status: int, retry_after: str) -> Iterator[str]:
    """An OTLP/HTTP endpoint that answers every POST with ``status`` and a Retry-After."""

    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Retry-After", retry_after)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"busy")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


def test_a_tee_keeps_each_body_and_sends_it_on_as_received(capture: OtlpHttpCapture) -> None:
    body = gzip.compress(_export("cmpl-r1-0"))
    with OtlpHttpCapture(forward_to=capture.endpoint) as tee:
        response = _post(tee, body, **{"Content-Encoding": "gzip", "Authorization": "Bearer t"})
        assert response.status_code == 200
        (kept,) = tee.snapshot()
    (sent,) = capture.snapshot()
    assert kept.body == sent.body == body
    assert sent.headers["content-encoding"] == "gzip"
    assert sent.headers["authorization"] == "Bearer t"
    assert sent.headers["content-type"] == "application/x-protobuf"


def test_a_tee_answers_with_what_the_endpoint_answered() -> None:
    with _refusing_receiver(503, "7") as url, OtlpHttpCapture(forward_to=url) as tee:
        response = _post(tee, _export("cmpl-r1-0"))
        assert len(tee.snapshot()) == 1  # kept, though refused downstream
    assert (response.status_code, response.headers["retry-after"], response.content) == (
        503,
        "7",
        b"busy",
    )


def test_a_tee_whose_endpoint_is_unreachable_answers_502() -> None:
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}/v1/traces"  # nothing listens there
    with OtlpHttpCapture(forward_to=url) as tee:
        response = _post(tee, _export("cmpl-r1-0"))
    assert response.status_code == 502
