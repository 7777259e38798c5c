"""A corrupt or torn DuckDB WAL is set aside with a loud log and a metric, not a crash loop;
a graceful stop checkpoints; a full volume makes the sidecar not ready, saying why."""

from __future__ import annotations

import os
import random
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from sidecar_harness import (
    BASE,
    LoopThread,
    StartSidecar,
    closed_port_url,
    post,
    relabel,
    request_ids,
    wait_for,
)

from slokit.sidecar.runner import Sidecar
from slokit.sources.otlp import decode_traces
from slokit.store.db import open_store


def test_a_corrupt_wal_is_quarantined_loudly_instead_of_a_crash_loop(
    start_sidecar: StartSidecar, tmp_path: Path, export_body: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    db = tmp_path / "wal.duckdb"
    store = open_store(db)
    store.con.execute("SET wal_autocheckpoint = '1TB'")
    store.con.execute("CHECKPOINT")
    store.append_fragments(decode_traces(export_body).fragments)
    wal = Path(str(db) + ".wal")
    data = bytearray(wal.read_bytes())
    # keep an image of the uncheckpointed state, as a crash would leave it
    image, wal_image = db.read_bytes(), bytes(data)
    store.close()
    db.write_bytes(image)
    data = bytearray(wal_image)
    data[200] ^= 0xFF  # flip one byte inside an entry: the checksum no longer matches
    wal.write_bytes(bytes(data))

    sc = start_sidecar(db=db)
    assert sc.value("slokit_wal_quarantined_total") == 1
    assert "CORRUPT WAL" in caplog.text
    aside = [p for p in tmp_path.iterdir() if ".wal.quarantined-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes() == bytes(data)
    assert httpx.get(f"{sc.api}/readyz").status_code == 200
    assert httpx.post(sc.otlp, content=export_body,
                      headers={"Content-Type": "application/x-protobuf"}).status_code == 200  # fmt: skip


def test_a_torn_wal_tail_loses_only_the_unfinished_transaction(
    start_sidecar: StartSidecar, tmp_path: Path, export_body: bytes
) -> None:
    db = tmp_path / "torn.duckdb"
    store = open_store(db)
    store.con.execute("SET wal_autocheckpoint = '1TB'")
    store.con.execute("CHECKPOINT")
    first, first_ids = relabel(export_body, "first")
    second, second_ids = relabel(export_body, "second")
    store.append_fragments(decode_traces(first).fragments)
    wal = Path(str(db) + ".wal")
    committed_size = wal.stat().st_size
    store.append_fragments(decode_traces(second).fragments)
    image, wal_image = db.read_bytes(), wal.read_bytes()
    store.close()
    db.write_bytes(image)
    # the crash came while the second transaction was being written
    wal.write_bytes(wal_image[: committed_size + (len(wal_image) - committed_size) // 2])

    sc = start_sidecar(db=db)
    assert sc.value("slokit_wal_quarantined_total") == 0
    stored = request_ids(sc)
    assert set(first_ids) <= stored
    assert not set(second_ids) & stored


def _crash_image(db: Path, bodies: list[bytes]) -> tuple[bytes, bytes, list[int]]:
    """The database file and WAL as a crash would leave them after committing ``bodies``
    (one transaction each), with the WAL size after each commit."""
    store = open_store(db)
    store.con.execute("SET wal_autocheckpoint = '1TB'")
    store.con.execute("CHECKPOINT")
    wal = Path(str(db) + ".wal")
    sizes = []
    for body in bodies:
        store.append_fragments(decode_traces(body).fragments)
        sizes.append(wal.stat().st_size)
    image, wal_image = db.read_bytes(), wal.read_bytes()
    store.close()
    return image, wal_image, sizes


def test_a_torn_wal_tail_is_logged_counted_and_kept_and_the_rest_checkpointed(
    start_sidecar: StartSidecar, tmp_path: Path, export_body: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    db = tmp_path / "torn.duckdb"
    first, first_ids = relabel(export_body, "first")
    second, second_ids = relabel(export_body, "second")
    image, wal_image, sizes = _crash_image(db, [first, second])
    torn = wal_image[: sizes[1] - 1]  # the last commit's final byte never reached the disk
    db.write_bytes(image)
    wal = Path(str(db) + ".wal")
    wal.write_bytes(torn)

    sc = start_sidecar(db=db)
    assert sc.value("slokit_wal_damaged_total", kind="torn_tail") == 1
    assert sc.value("slokit_wal_quarantined_total") == 0
    assert "TORN WAL" in caplog.text and f"last {len(torn) - sizes[0]} bytes" in caplog.text
    (kept,) = [p for p in tmp_path.iterdir() if ".wal.torn-" in p.name]
    assert kept.read_bytes() == torn
    stored = request_ids(sc)
    assert set(first_ids) <= stored and not set(second_ids) & stored
    # replayed and checkpointed at start: the WAL no longer holds the torn bytes
    assert not wal.exists() or wal.stat().st_size < len(torn)
    assert httpx.get(f"{sc.api}/readyz").status_code == 200


def test_a_wal_duckdb_does_not_recognise_is_logged_counted_and_kept(
    start_sidecar: StartSidecar, tmp_path: Path, export_body: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    db = tmp_path / "junk.duckdb"
    image, _, _ = _crash_image(db, [export_body])
    db.write_bytes(image)
    junk = random.Random(5).randbytes(4000)
    Path(str(db) + ".wal").write_bytes(junk)

    sc = start_sidecar(db=db)
    assert sc.value("slokit_wal_damaged_total", kind="discarded") == 1
    assert "UNREADABLE WAL" in caplog.text
    (kept,) = [p for p in tmp_path.iterdir() if ".wal.unreadable-" in p.name]
    assert kept.read_bytes() == junk
    assert httpx.get(f"{sc.api}/readyz").status_code == 200


def test_a_wal_that_ends_at_a_commit_is_replayed_without_alarm(
    start_sidecar: StartSidecar, tmp_path: Path, export_body: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    db = tmp_path / "crash.duckdb"
    image, wal_image, _ = _crash_image(db, [export_body])
    db.write_bytes(image)
    Path(str(db) + ".wal").write_bytes(wal_image)

    sc = start_sidecar(db=db)
    assert sc.value("slokit_wal_damaged_total", kind="torn_tail") == 0
    assert sc.value("slokit_wal_damaged_total", kind="discarded") == 0
    assert "WAL" not in caplog.text
    assert len(request_ids(sc)) == 64
    assert not [p for p in tmp_path.iterdir() if ".wal." in p.name]


def test_a_graceful_stop_checkpoints_the_wal_into_the_file(
    tmp_path: Path, export_body: bytes
) -> None:
    db = tmp_path / "stop.duckdb"
    lt = LoopThread()
    sc = Sidecar(replace(BASE, db=str(db)), registry=CollectorRegistry())
    try:
        lt.call(sc.start())
        assert sc.store is not None
        sc.store.con.execute("SET wal_autocheckpoint = '1TB'")
        port = sc.ports["otlp_http"]
        assert post(f"http://127.0.0.1:{port}/v1/traces", export_body).status_code == 200
        wal = Path(str(db) + ".wal")
        assert wal.stat().st_size > 0
        lt.call(sc.stop())
    finally:
        lt.close()
    assert not wal.exists() or wal.stat().st_size == 0
    with open_store(db, read_only=True) as store:
        assert store.con.execute("SELECT count(*) FROM requests").fetchone() == (64,)


def _free_port() -> int:
    return int(closed_port_url().split(":")[2].split("/")[0])


def _fill_at(limit: int) -> Callable[[], None]:
    def preexec() -> None:
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))

    return preexec


@pytest.mark.parametrize("commit_interval", ["0", None], ids=["commit-per-batch", "journal"])
def test_a_sidecar_whose_volume_fills_is_not_ready_and_says_why(
    tmp_path: Path, export_body: bytes, commit_interval: str | None
) -> None:
    """Never ready and 503 for ever: once writes fail for want of space (RLIMIT_FSIZE: the
    kernel refuses writes past 1 MB, as a full volume would), exports get 503 (retryable:
    nothing is acknowledged that is not kept) and /readyz 503 with the reason. Each batch
    committed: DuckDB's commit fails; with the journal (the default), its appends fill the
    1 MB before an interval has passed."""
    api, otlp = _free_port(), _free_port()
    log_path = tmp_path / "sidecar.log"
    env = dict(os.environ)
    if commit_interval is not None:
        env["SLOKIT_COMMIT_INTERVAL_S"] = commit_interval
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slokit.sidecar", "--db", str(tmp_path / "full.duckdb"),
             "--replica", "full", "--listen", f"127.0.0.1:{api}",
             "--otlp-http", f"127.0.0.1:{otlp}", "--otlp-grpc", ""],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_fill_at(1_000_000), env=env,
        )  # fmt: skip
        try:
            wait_for(lambda: _ready(proc, api) == 200, 60, "readyz 200")
            codes = []
            for i in range(200):
                body, _ = relabel(export_body, f"full{i}")
                codes.append(post(f"http://127.0.0.1:{otlp}/v1/traces", body).status_code)
                if codes[-1] != 200:
                    break
            assert codes[-1] == 503 and set(codes[:-1]) == {200}
            ready = httpx.get(f"http://127.0.0.1:{api}/readyz")
            assert ready.status_code == 503
            doc = ready.json()
            assert doc["storage"] is False and "File too large" in doc["reason"]
            assert proc.poll() is None  # it keeps running, and says why
        finally:
            proc.terminate()
            proc.wait(30)
    assert "File too large" in log_path.read_text()


def _ready(proc: subprocess.Popen[bytes], port: int) -> int:
    assert proc.poll() is None, "sidecar exited"
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz").status_code
    except httpx.HTTPError:
        return 0
