"""The sidecar's store keeps at most ``retention_requests`` requests: the oldest are deleted by
its periodic retention, counted in ``slokit_requests_pruned_total``."""

from __future__ import annotations

import httpx
import pytest
from sidecar_harness import StartSidecar, post, relabel, request_ids, wait_for

from slokit.sidecar import runner
from slokit.sidecar.config import SidecarConfig


def test_the_oldest_requests_past_retention_requests_are_deleted(
    start_sidecar: StartSidecar, export_body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "RETENTION_INTERVAL_S", 0.05)
    sc = start_sidecar(retention_requests=1000)
    batches = [relabel(export_body, f"b{i:02d}") for i in range(20)]  # 20 x 64 requests
    for body, _ in batches:
        assert post(sc.otlp, body).status_code == 200
        sc.committed()  # one commit per export: the batches are first seen in order
    wait_for(lambda: sc.value("slokit_requests_pruned_total") >= 280, timeout=60, what="retention")
    stored = request_ids(sc)
    assert len(stored) == 1000
    assert set(batches[-1][1]) <= stored  # the newest are kept
    assert not set(batches[0][1]) & stored  # the oldest are gone
    assert sc.value("slokit_requests_pruned_total") == 280


def test_explaining_a_request_it_no_longer_holds_says_where_it_went(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar(retention_requests=1000, retention_s=3600)
    res = httpx.get(f"{sc.api}/api/explain/gone-1")
    assert res.status_code == 404
    assert res.json()["error"] == (
        "no request 'gone-1' in the store; this sidecar keeps its newest 1,000 requests and "
        "those first seen in the last 3600 s (retention); an older one is gone: no lake "
        "(parquet_dir) is set"
    )


def test_a_sidecar_that_keeps_everything_adds_nothing_to_a_404(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar(retention_requests=0, retention_s=0)
    res = httpx.get(f"{sc.api}/api/explain/gone-1")
    assert res.json()["error"] == "no request 'gone-1' in the store"


def test_with_a_lake_the_404_points_to_it() -> None:
    cfg = SidecarConfig(parquet_dir="/lake", retention_s=0)
    assert runner.retention_hint(cfg) == (
        "this sidecar keeps its newest 150,000 requests (retention); an older one is in the lake "
        "(parquet_dir)"
    )
