"""The sidecar's store keeps at most ``retention_requests`` requests: the oldest are deleted by
its periodic retention, counted in ``slokit_requests_pruned_total``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sidecar_harness import (
    Running,
    StartSidecar,
    TargetServer,
    post,
    relabel,
    request_ids,
    store_rows,
    wait_for,
)

from slokit.cli import main
from slokit.sidecar import runner
from slokit.sidecar.config import SidecarConfig
from slokit.sources.otlp import decode_traces
from slokit.store.db import Store, open_store
from slokit.store.retention import prune_requests
from slokit.timeutil import parse_time


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


def _moved(body: bytes, to_s: float) -> bytes:
    """The export with its spans moved in time, the earliest to start at ``to_s``."""
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    spans = [sp for rs in msg.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    delta = int(to_s * 1e9) - min(sp.start_time_unix_nano for sp in spans)
    for sp in spans:
        sp.start_time_unix_nano += delta
        sp.end_time_unix_nano += delta
        for event in sp.events:
            event.time_unix_nano += delta
    return msg.SerializeToString()


def test_a_diagnosis_starts_where_the_requests_retention_kept_begin(
    start_sidecar: StartSidecar, export_body: bytes, target: TargetServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Retention deletes the oldest requests while the engine samples before them stay:
    ``/api/diagnose`` starts its window and baseline at the newest arrival it deleted (a
    baseline of samples without their requests would blind the request rules), and says so."""
    monkeypatch.setattr(runner, "RETENTION_INTERVAL_S", 0.05)
    sc = start_sidecar(retention_requests=1000, vllm_urls=(target.url,), scrape_interval_s=0.2)
    samples = "SELECT count(*) FROM engine_samples"
    wait_for(lambda: store_rows(sc, samples)[0][0] >= 2, what="engine samples")
    t0 = time.time()  # batch i arrives at t0 + i, after the first samples
    first: list[str] = []
    for i in range(20):  # 20 x 64 requests: the first 280 (batches 0-3, 24 of batch 4) go
        body, ids = relabel(_moved(export_body, t0 + i), f"b{i:02d}")
        first = first or ids
        assert post(sc.otlp, body).status_code == 200
        sc.committed()  # one commit per export: the batches are first seen in order
    wait_for(lambda: sc.value("slokit_requests_pruned_total") >= 280, timeout=60, what="retention")
    window = httpx.get(f"{sc.api}/api/diagnose", timeout=60).json()["window"]
    kept_from = parse_time(window["requests_from"])
    assert t0 + 4 <= kept_from < t0 + 4.01, (window, t0)  # batch 4's arrivals
    assert parse_time(window["since"]) == kept_from
    assert parse_time(window["baseline"]["since"]) >= kept_from
    assert sc.value("slokit_requests_whole_from_timestamp_seconds") == pytest.approx(kept_from)
    oldest_sample = store_rows(sc, "SELECT epoch(min(ts)) FROM engine_samples")[0][0]
    assert oldest_sample < t0  # the samples before it are still held
    # `slokit diagnose --sidecar` (and --db of a running sidecar's file) asks it the same
    res = CliRunner().invoke(main, ["diagnose", "--sidecar", sc.api, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["window"]["requests_from"] == window["requests_from"]
    # explain of a deleted request says up to when requests were deleted
    gone = httpx.get(f"{sc.api}/api/explain/{first[0]}", timeout=60)
    assert gone.status_code == 404
    assert gone.json()["requests_from"] == window["requests_from"]
    assert f"it deleted those that arrived up to {window['requests_from']}" in gone.json()["error"]


def _stopped_sidecars_store(db: Path, export_body: bytes, t0: float) -> Store:
    """A store as a stopped sidecar leaves it: an engine sample at ``t0 - 600``, then 16
    batches of 64 requests (over a bound of 1,000), batch i arriving at ``t0 + i``."""
    store = open_store(db)
    store.con.execute(
        "INSERT INTO engine_samples (ts, replica, model) VALUES (to_timestamp(?), 'p', 'm')",
        [t0 - 600],
    )
    for i in range(16):
        body, _ = relabel(_moved(export_body, t0 + i), f"b{i:02d}")
        store.append_fragments(decode_traces(body).fragments)
    return store


def test_a_sidecar_restarted_on_a_store_at_its_bound_diagnoses_from_its_oldest_request(
    start_sidecar: StartSidecar, export_body: bytes, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A store already holding ``retention_requests``, that keeps no mark (pruned before
    schema 11 kept one), was pruned by an earlier run: its requests are whole from the oldest
    it holds, before the first retention tick says so."""
    db = tmp_path / "full.duckdb"
    t0 = time.time() - 600
    with _stopped_sidecars_store(db, export_body, t0) as store:
        oldest = store.con.execute("SELECT epoch(min(arrival_ts)) FROM requests").fetchall()
    monkeypatch.setattr(runner, "RETENTION_INTERVAL_S", 3600.0)  # no tick during the test
    sc = start_sidecar(db=db, retention_requests=1000)
    window = httpx.get(f"{sc.api}/api/diagnose", timeout=60).json()["window"]
    assert parse_time(window["requests_from"]) == pytest.approx(oldest[0][0], abs=1e-3)
    assert parse_time(window["since"]) >= oldest[0][0] - 1e-3


def test_a_stopped_sidecars_file_says_where_its_requests_are_whole_and_a_restart_keeps_it(
    start_sidecar: StartSidecar, export_body: bytes, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    """The file keeps what retention deleted: ``slokit diagnose --db`` of a stopped sidecar's
    file and a sidecar restarted on it start there, not at the oldest request kept (here one
    a sender's clock stamped ten minutes behind, arrived after the deletion)."""
    db = tmp_path / "pruned.duckdb"
    t0 = time.time() - 600
    with _stopped_sidecars_store(db, export_body, t0) as store:  # 24 over the bound: batch 0's go
        mark = prune_requests(store, now=time.time(), max_requests=1000).whole_from
        body, _ = relabel(_moved(export_body, t0 - 600), "behind")
        store.append_fragments(decode_traces(body).fragments)
        oldest = store.con.execute("SELECT epoch(min(arrival_ts)) FROM requests").fetchall()
    assert mark is not None and t0 <= mark < t0 + 1  # batch 0's
    assert oldest[0][0] < t0 - 590  # what a restart would take without the mark
    res = CliRunner().invoke(main, ["diagnose", "--db", str(db), "--since", "2h", "--json"])
    assert res.exit_code in (0, 1), res.output  # 1: findings
    assert parse_time(json.loads(res.output)["window"]["requests_from"]) == pytest.approx(mark)
    monkeypatch.setattr(runner, "RETENTION_INTERVAL_S", 3600.0)  # no tick during the test
    sc = start_sidecar(db=db, retention_requests=1000)
    window = httpx.get(f"{sc.api}/api/diagnose", timeout=60).json()["window"]
    assert parse_time(window["requests_from"]) == pytest.approx(mark, abs=1e-3)
    assert sc.value("slokit_requests_whole_from_timestamp_seconds") == pytest.approx(mark)


def test_explaining_a_request_it_no_longer_holds_says_where_it_went(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar(retention_requests=1000, retention_s=3600)
    res = httpx.get(f"{sc.api}/api/explain/gone-1")
    assert res.status_code == 404
    assert res.json()["error"] == (
        "no request 'gone-1' in the store; this sidecar keeps its newest 1,000 requests and "
        "those first seen in the last 3600 s (retention); an older one is gone: no lake "
        "(parquet_dir) is set; it has recorded no deletion: the request never reached it"
    )
    assert res.json()["retention"] == runner.retention_hint(sc.sidecar.config)
    assert "requests_from" not in res.json()


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
