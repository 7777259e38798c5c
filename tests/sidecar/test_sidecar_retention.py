"""The sidecar's store keeps at most ``retention_requests`` requests: the oldest are deleted by
its periodic retention, counted in ``slokit_requests_pruned_total``."""

from __future__ import annotations

import pytest
from sidecar_harness import StartSidecar, post, relabel, request_ids, wait_for

from slokit.sidecar import runner


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
