"""The API on 9464: probes, explain/diagnose for `slokit explain --sidecar`, feedback, SLI."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sidecar_harness import Running, StartSidecar, post, wait_for

from slokit.client import SidecarClient
from slokit.errors import NotFound
from slokit.sidecar import runner

REPO = Path(__file__).resolve().parents[2]
SLO = REPO / "examples" / "slo" / "chat.yaml"


def _quality(sc: Running, rid: str) -> object:
    cur = sc.committed().cursor()
    try:
        return cur.execute(
            "SELECT quality_pass FROM requests WHERE request_id = ?", [rid]
        ).fetchone()
    finally:
        cur.close()


def test_probes_answer_when_started(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar()
    assert httpx.get(f"{sc.api}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{sc.api}/readyz")
    assert ready.status_code == 200
    assert ready.json()["writer"] is True and ready.json()["store"] is True


def test_readyz_is_503_once_the_writer_is_gone(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar()
    assert sc.sidecar.writer is not None
    sc.sidecar.writer.stop()
    resp = httpx.get(f"{sc.api}/readyz")
    assert resp.status_code == 503
    assert resp.json()["writer"] is False


def test_explain_through_the_sidecar_client_while_the_file_is_locked(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar()
    assert post(sc.otlp, export_body).status_code == 200
    doc = SidecarClient(sc.api).explain("cmpl-r7-0")
    assert doc["request_id"] == "r7"
    assert doc["replica"] == "test-pod"
    assert doc["dominant"] in ("queue", "prefill", "decode", "preemption", "client", "unknown")
    with pytest.raises(NotFound):
        SidecarClient(sc.api).explain("no-such-request")


def test_diagnose_through_the_sidecar_client(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar()
    assert post(sc.otlp, export_body).status_code == 200
    doc = SidecarClient(sc.api).diagnose()
    assert set(doc) >= {"window", "findings", "coverage"}


def test_feedback_sets_quality_on_the_request(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar()
    assert post(sc.otlp, export_body).status_code == 200
    resp = httpx.post(f"{sc.api}/v1/feedback", json=[
        {"request_id": "r1", "quality_pass": True},
        {"request_id": "cmpl-r2", "quality_pass": False},
    ])  # fmt: skip
    assert resp.status_code == 200 and resp.json() == {"accepted": 2}
    assert _quality(sc, "r1") == (True,)
    assert _quality(sc, "r2") == (False,)
    one = httpx.post(f"{sc.api}/v1/feedback", json={"request_id": "r3", "quality_pass": "pass"})
    assert one.status_code == 200
    assert _quality(sc, "r3") == (True,)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "GZIP"])
def test_feedback_may_come_compressed(
    start_sidecar: StartSidecar, export_body: bytes, encoding: str
) -> None:
    sc = start_sidecar()
    assert post(sc.otlp, export_body).status_code == 200
    body = b'[{"request_id": "r4", "quality_pass": false}]'
    data = gzip.compress(body) if encoding.lower() == "gzip" else zlib.compress(body)
    resp = httpx.post(f"{sc.api}/v1/feedback", content=data,
                      headers={"Content-Type": "application/json", "Content-Encoding": encoding})  # fmt: skip
    assert resp.status_code == 200 and resp.json() == {"accepted": 1}
    assert _quality(sc, "r4") == (False,)


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b"[1, 2]", b'{"request_id": "r1"}', b'{"quality_pass": true}'],
)
def test_bad_feedback_is_400(start_sidecar: StartSidecar, body: bytes) -> None:
    sc = start_sidecar()
    resp = httpx.post(f"{sc.api}/v1/feedback", content=body,
                      headers={"Content-Type": "application/json"})  # fmt: skip
    assert resp.status_code == 400
    assert "error" in resp.json()


def test_metrics_count_each_finished_request_once_by_slo_outcome(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(slo=str(SLO))
    assert post(sc.otlp, export_body).status_code == 200
    assert post(sc.otlp, export_body).status_code == 200  # a retry changes nothing

    def counted() -> float:
        fams = text_string_to_metric_families(httpx.get(f"{sc.api}/metrics").text)
        return sum(s.value for f in fams if f.name == "slokit_requests" for s in f.samples
                   if s.name == "slokit_requests_total")  # fmt: skip

    wait_for(lambda: counted() == 64, what="64 requests counted")
    with sc.committed().cursor() as cur:
        rows = cur.execute("SELECT count(*) FROM requests").fetchone()
    assert rows == (64,)
    good = sc.value("slokit_requests_total", **{"class": "default", "replica": "test-pod",
                                                "model": "", "outcome": "good"})  # fmt: skip
    slow = sc.value("slokit_requests_total", **{"class": "default", "replica": "test-pod",
                                                "model": "", "outcome": "slow"})  # fmt: skip
    assert good + slow == 64
    assert sc.value("slokit_slo_objective_ratio", **{"class": "interactive"}) == 0.99
    assert sc.value("slokit_slo_bound_seconds", **{"class": "interactive", "bound": "ttft"}) == 1.0


def test_metrics_expose_the_health_series(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar(queue_capacity=1234)
    text = httpx.get(f"{sc.api}/metrics").text
    for name in ("slokit_write_queue_depth", "slokit_write_queue_capacity 1234.0",
                 "slokit_ingest_lag_seconds", "slokit_wal_quarantined_total"):  # fmt: skip
        assert name in text


def test_slokit_explain_sidecar_shows_the_joined_record(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    from click.testing import CliRunner

    from slokit.cli import main

    sc = start_sidecar()
    assert post(sc.otlp, export_body).status_code == 200
    res = CliRunner().invoke(main, ["explain", "r5", "--sidecar", sc.api, "--json"])
    assert res.exit_code == 0, res.output
    assert '"request_id": "r5"' in res.output
    missing = CliRunner().invoke(main, ["explain", "nope", "--sidecar", sc.api])
    assert missing.exit_code == 3


def test_the_running_sidecar_can_be_found_from_its_db_file(start_sidecar: StartSidecar) -> None:
    from slokit.sidecar.discovery import discovery_path, find_sidecar

    sc = start_sidecar()
    assert find_sidecar(sc.db) == sc.api
    assert httpx.get(f"{find_sidecar(sc.db)}/healthz").status_code == 200
    discovery_path(sc.db).write_text('{"api": "http://127.0.0.1:1", "pid": 999999999}')
    assert find_sidecar(sc.db) is None  # a dead sidecar's leftover is ignored


def test_metrics_expose_the_store_s_memory_against_its_limit(
    start_sidecar: StartSidecar, export_body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "STORE_USAGE_INTERVAL_S", 0.1)
    sc = start_sidecar(db_memory_limit="64MB")
    wal_at_start = sc.value("slokit_db_file_bytes", part="wal")
    assert post(sc.otlp, export_body).status_code == 200
    sc.committed()  # the requests are in the WAL until a checkpoint
    wait_for(lambda: sc.value("slokit_db_file_bytes", part="wal") > wal_at_start,
             what="the periodic read to see the WAL grow", timeout=60)  # fmt: skip
    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{sc.api}/metrics").text)}
    limit = fams["slokit_db_memory_limit_bytes"].samples[0].value
    assert abs(limit - 64_000_000) <= 640_000
    tags = {s.labels["tag"] for s in fams["slokit_db_memory_bytes"].samples}
    assert {"ART_INDEX", "BASE_TABLE", "HASH_TABLE"} <= tags
    parts = {s.labels["part"]: s.value for s in fams["slokit_db_file_bytes"].samples}
    assert parts.keys() == {"used", "free", "wal"}
    assert parts["used"] + parts["wal"] > 0
    assert fams["slokit_db_temp_storage_bytes"].samples[0].value == 0


def test_metrics_expose_the_store_s_memory_limit_from_the_start(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar()
    limit = sc.value("slokit_db_memory_limit_bytes")
    assert abs(limit - 128_000_000) <= 1_280_000  # the default db_memory_limit, 128MB
    assert sc.registry.get_sample_value("slokit_db_memory_bytes", {"tag": "ART_INDEX"}) is not None


def test_metrics_expose_what_arrow_s_pool_holds(start_sidecar: StartSidecar) -> None:
    import pyarrow as pa

    sc = start_sidecar()  # in this process: it reads the pool this test allocates from
    held = pa.allocate_buffer(64 << 20)  # 64 MiB more than anything the sidecar holds
    assert sc.value("slokit_arrow_allocated_bytes") >= held.size
    del held
    assert sc.value("slokit_arrow_allocated_bytes") < 64 << 20
