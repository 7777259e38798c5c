"""OTLP/HTTP receiver: answers per the OTLP/HTTP spec, and 200 means committed."""

from __future__ import annotations

import base64
import gzip
import json

from google.protobuf import json_format
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from sidecar_harness import StartSidecar, post, relabel, request_ids


def _to_otlp_json(body: bytes) -> bytes:
    """Protobuf export -> OTLP/JSON (ids as hex, as the OTLP/JSON encoding requires)."""
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    doc = json_format.MessageToDict(msg)

    def hexify(o: object) -> object:
        if isinstance(o, dict):
            return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId")
                        else hexify(v)) for k, v in o.items()}  # fmt: skip
        if isinstance(o, list):
            return [hexify(x) for x in o]
        return o

    return json.dumps(hexify(doc)).encode()


def test_protobuf_export_is_in_the_store_when_200_comes_back(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar()
    resp = post(sc.otlp, export_body)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/x-protobuf")
    out = ExportTraceServiceResponse()
    out.ParseFromString(resp.content)
    assert not out.HasField("partial_success")
    # no waiting: the spans were committed before the answer
    assert {f"r{i}" for i in range(64)} <= request_ids(sc)
    assert sc.value("slokit_spans_received_total", protocol="http") == 64
    assert sc.value("slokit_otlp_requests_total", protocol="http", code="200") == 1


def test_otlp_json_export_is_accepted_and_answered_in_json(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar()
    body, ids = relabel(export_body, "json")
    resp = post(sc.otlp, _to_otlp_json(body), "application/json")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/json")
    assert resp.json() == {}
    assert set(ids) <= request_ids(sc)


def test_gzip_body_is_accepted(start_sidecar: StartSidecar, export_body: bytes) -> None:
    sc = start_sidecar()
    body, ids = relabel(export_body, "gz")
    resp = post(sc.otlp, gzip.compress(body), **{"Content-Encoding": "gzip"})
    assert resp.status_code == 200
    assert set(ids) <= request_ids(sc)


def test_body_over_the_limit_is_413(start_sidecar: StartSidecar, export_body: bytes) -> None:
    sc = start_sidecar(max_body_bytes=len(export_body) - 1)
    resp = post(sc.otlp, export_body)
    assert resp.status_code == 413
    assert request_ids(sc) == set()


def test_gzip_bomb_is_413_after_decompression(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar(max_body_bytes=1024 * 1024)
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024))  # 64 MiB of zeros in ~64 KiB
    assert len(bomb) < 1024 * 1024
    resp = post(sc.otlp, bomb, **{"Content-Encoding": "gzip"})
    assert resp.status_code == 413
    st = status_pb2.Status()
    st.ParseFromString(resp.content)
    assert "limit" in st.message


def test_undecodable_protobuf_is_400_with_a_google_rpc_status(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar()
    resp = post(sc.otlp, b"\x0a\xff\xff\xff\xff\x0fnot protobuf")
    assert resp.status_code == 400
    st = status_pb2.Status()
    st.ParseFromString(resp.content)
    assert st.code == code_pb2.INVALID_ARGUMENT
    assert "undecodable" in st.message
    assert sc.value("slokit_otlp_requests_total", protocol="http", code="400") == 1


def test_undecodable_json_is_400_with_a_json_status(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar()
    resp = post(sc.otlp, b'{"resourceSpans": [', "application/json")
    assert resp.status_code == 400
    assert resp.json()["code"] == code_pb2.INVALID_ARGUMENT


def test_unknown_content_type_is_415(start_sidecar: StartSidecar, export_body: bytes) -> None:
    sc = start_sidecar()
    assert post(sc.otlp, export_body, "text/plain").status_code == 415


def test_get_is_405(start_sidecar: StartSidecar) -> None:
    import httpx

    sc = start_sidecar()
    assert httpx.get(sc.otlp).status_code == 405


def test_spans_with_empty_trace_ids_are_counted_in_partial_success(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar()
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(export_body)
    spans = msg.resource_spans[0].scope_spans[0].spans
    for span in spans[:5]:
        span.trace_id = b""
    resp = post(sc.otlp, msg.SerializeToString())
    assert resp.status_code == 200
    out = ExportTraceServiceResponse()
    out.ParseFromString(resp.content)
    assert out.partial_success.rejected_spans == 5
    assert "trace id" in out.partial_success.error_message
    assert len(request_ids(sc)) == len(spans) - 5
    assert sc.value("slokit_spans_rejected_total", reason="empty or malformed trace id") == 5
