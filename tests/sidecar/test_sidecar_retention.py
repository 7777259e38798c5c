"""The sidecar's store keeps at most ``retention_requests`` requests: the oldest are deleted by
its periodic retention, counted in ``slokit_requests_pruned_total``."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from sidecar_harness import Running, StartSidecar, post, relabel, request_ids, wait_for

from slokit.sidecar import runner
from slokit.sidecar.config import SidecarConfig
from slokit.store.db import open_store


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


def test_a_lake_that_cannot_write_holds_back_no_more_than_lake_hold_requests(
    start_sidecar: StartSidecar, export_body: bytes, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    monkeypatch.setattr(runner, "RETENTION_INTERVAL_S", 0.05)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the lake's directory should be")
    sc = start_sidecar(retention_requests=1000, lake_hold_requests=500,
                       parquet_dir=str(blocker / "lake"))  # fmt: skip
    batches = [relabel(export_body, f"b{i:02d}") for i in range(30)]  # 30 x 64 requests
    for body, _ in batches:
        assert post(sc.otlp, body).status_code == 200
        sc.committed()  # one commit per export: the batches are first seen in order
    wait_for(lambda: sc.value("slokit_requests_pruned_total") >= 420, timeout=60,
             what="the bound past the lake's hold")  # fmt: skip
    stored = request_ids(sc)
    assert len(stored) == 1500
    assert set(batches[-1][1]) <= stored  # the newest are kept
    assert not set(batches[0][1]) & stored
    unwritten = {"state": "unwritten"}
    assert sc.value("slokit_requests_pruned_before_lake_total", **unwritten) == 420


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
    assert res.json()["retention"] == runner.retention_hint(sc.sidecar.config)


def test_a_sidecar_that_keeps_everything_adds_nothing_to_a_404(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar(retention_requests=0, retention_s=0)
    res = httpx.get(f"{sc.api}/api/explain/gone-1")
    assert res.json() == {"error": "no request 'gone-1' in the store"}


def test_with_a_lake_the_404_points_to_it() -> None:
    cfg = SidecarConfig(parquet_dir="/lake", retention_s=0)
    assert runner.retention_hint(cfg) == (
        "this sidecar keeps its newest 150,000 requests (retention); an older one is in the lake "
        "(parquet_dir)"
    )


def test_time_series_rows_older_than_retention_s_are_deleted_and_counted(
    start_sidecar: StartSidecar, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    db = tmp_path / "old.duckdb"
    now = time.time()
    with open_store(db) as store:  # a file the sidecar ran on two hours ago, and one recent row
        for at in (now - 7200, now - 7100, now - 60):
            store.con.execute(
                "INSERT INTO engine_samples (ts, replica, model) VALUES (to_timestamp(?), 'p', 'm')",
                [at],
            )
        store.con.execute(
            "INSERT INTO scrapes VALUES (to_timestamp(?), 'http://x', 'vllm', 'p', true, 0.1, "
            "NULL, 12)",
            [now - 7200],
        )
    monkeypatch.setattr(runner, "RETENTION_INTERVAL_S", 0.05)
    sc = start_sidecar(db=db, retention_s=900)
    wait_for(
        lambda: (
            sc.value("slokit_rows_pruned_total", table="scrapes") >= 1
            and sc.value("slokit_rows_pruned_total", table="engine_samples") >= 2
        ),
        timeout=60,
        what="the time series pruned",
    )
    assert sc.value("slokit_rows_pruned_total", table="engine_samples") == 2
    rows = sc.committed().con.execute("SELECT epoch(ts) FROM engine_samples").fetchall()
    assert [round(r[0]) for r in rows] == [round(now - 60)]


def _vacuum_tasks(sc: Running) -> int:
    store = sc.committed()
    return int(store.con.execute("SELECT current_setting('max_vacuum_tasks')").fetchall()[0][0])


def test_a_sidecar_that_prunes_turns_duckdbs_vacuum_off(start_sidecar: StartSidecar) -> None:
    assert _vacuum_tasks(start_sidecar(retention_requests=1000, retention_s=0)) == 0
    assert _vacuum_tasks(start_sidecar(retention_requests=0, retention_s=900)) == 0


def test_a_sidecar_that_keeps_everything_keeps_duckdbs_vacuum(start_sidecar: StartSidecar) -> None:
    """Without pruning, a request merged again leaves a dead row only the vacuum reclaims."""
    assert _vacuum_tasks(start_sidecar(retention_requests=0, retention_s=0)) > 0
