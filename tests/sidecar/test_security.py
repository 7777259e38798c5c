"""Loopback by default, a bearer token beyond it, and no prompt/completion text kept anywhere."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from sidecar_harness import StartSidecar, post, request_ids

from slokit.errors import BadInput
from slokit.sidecar.config import SidecarConfig
from slokit.sidecar.otlp_grpc import METHOD

TOKEN = "s3cret-token"
CANARY = "CANARY-7f3a9c-do-not-store"


def test_every_endpoint_binds_loopback_by_default() -> None:
    cfg = SidecarConfig()
    assert cfg.listen == "127.0.0.1:9464"
    assert cfg.otlp_http == "127.0.0.1:4318"
    assert cfg.otlp_grpc == "127.0.0.1:4317"
    assert cfg.validate() is cfg


@pytest.mark.parametrize("field", ["listen", "otlp_http", "otlp_grpc"])
def test_a_non_loopback_address_without_a_token_is_refused(field: str) -> None:
    with pytest.raises(BadInput, match="token"):
        SidecarConfig(**{field: "0.0.0.0:9464"}).validate()  # type: ignore[arg-type]


def test_with_a_token_requests_without_it_get_401(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(listen="0.0.0.0:0", otlp_http="0.0.0.0:0", token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{sc.api}/metrics").status_code == 401
    assert (
        httpx.get(f"{sc.api}/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    )
    assert httpx.get(f"{sc.api}/api/explain/r1").status_code == 401
    assert post(sc.otlp, export_body).status_code == 401
    assert request_ids(sc) == set()
    assert post(sc.otlp, export_body, **auth).status_code == 200
    assert httpx.get(f"{sc.api}/metrics", headers=auth).status_code == 200
    assert httpx.get(f"{sc.api}/healthz").status_code == 200  # probes stay open


def test_with_a_token_grpc_without_it_is_unauthenticated(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(token=TOKEN)
    with grpc.insecure_channel(sc.grpc_target) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            call(export_body, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        call(export_body, timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert "r0" in request_ids(sc)


def _with_canary(body: bytes) -> bytes:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    for rs in msg.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                for key in ("gen_ai.prompt", "gen_ai.completion", "gen_ai.input.messages",
                            "gen_ai.output.messages"):  # fmt: skip
                    span.attributes.append(KeyValue(key=key))
                    span.attributes[-1].value.string_value = f"{key}: {CANARY}"
                event = span.events.add(name="gen_ai.content.prompt")
                event.attributes.append(KeyValue(key="gen_ai.prompt"))
                event.attributes[-1].value.string_value = CANARY
    return msg.SerializeToString()


def test_prompt_and_completion_text_is_stored_and_logged_nowhere(
    start_sidecar: StartSidecar, export_body: bytes, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    db = tmp_path / "canary.duckdb"
    sc = start_sidecar(db=db)
    body = _with_canary(export_body)
    assert CANARY.encode() in body
    assert post(sc.otlp, body).status_code == 200
    with grpc.insecure_channel(sc.grpc_target) as ch:
        ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)(
            body, timeout=10
        )
    assert "r0" in request_ids(sc)
    assert CANARY not in httpx.get(f"{sc.api}/metrics").text
    assert CANARY not in httpx.get(f"{sc.api}/api/explain/r0").text
    # the WAL as it is now (uncheckpointed), then the database file after a clean stop
    files = [p for p in tmp_path.iterdir() if p.name.startswith("canary")]
    assert files
    for p in files:
        assert CANARY.encode() not in p.read_bytes(), p
    with sc.committed().cursor() as cur:
        # every row of every table, as text (the file's own strings may be compressed)
        tables = [r[0] for r in cur.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        assert "requests" in tables
        for t in tables:
            hits = cur.execute(f"SELECT count(*) FROM {t} AS r WHERE contains(r::VARCHAR, ?)",
                               [CANARY]).fetchone()  # fmt: skip
            assert hits == (0,), t
        control = cur.execute("SELECT count(*) FROM requests AS r WHERE contains(r::VARCHAR, ?)",
                              ["test-pod"]).fetchone()  # fmt: skip
        assert control == (64,)
        cur.execute("CHECKPOINT")  # move the WAL into the database file
    for p in tmp_path.iterdir():
        assert CANARY.encode() not in p.read_bytes(), p
    assert CANARY not in caplog.text


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (f"Bearer {TOKEN}", 200),
        (f"bearer {TOKEN}", 200),  # RFC 7235: the scheme is case-insensitive
        (f"BEARER {TOKEN}", 200),
        (f"Bearer   {TOKEN}", 200),
        (f"Basic {TOKEN}", 401),
        (TOKEN, 401),
        ("Bearer", 401),
        (f"Bearer {TOKEN[:-1]}", 401),
        (f"Bearer {TOKEN}x", 401),
        (f"Bearer {TOKEN.upper()}", 401),  # the token itself is not
    ],
)
def test_the_bearer_scheme_is_case_insensitive_and_the_token_exact(
    start_sidecar: StartSidecar, authorization: str, status: int
) -> None:
    sc = start_sidecar(token=TOKEN)
    resp = httpx.get(f"{sc.api}/metrics", headers={"Authorization": authorization})
    assert resp.status_code == status


def test_grpc_takes_a_lower_case_bearer_scheme_too(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(token=TOKEN)
    with grpc.insecure_channel(sc.grpc_target) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        call(export_body, timeout=10, metadata=(("authorization", f"bearer {TOKEN}"),))
        with pytest.raises(grpc.RpcError) as err:
            call(export_body, timeout=10, metadata=(("authorization", f"bearer {TOKEN}x"),))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "r0" in request_ids(sc)


def test_a_blank_token_is_refused_before_anything_listens() -> None:
    with pytest.raises(BadInput, match="blank"):
        SidecarConfig(listen="0.0.0.0:9464", token="   ").validate()
