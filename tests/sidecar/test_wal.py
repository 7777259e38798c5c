"""A corrupt or torn DuckDB WAL is set aside with a loud log and a metric, not a crash loop."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sidecar_harness import StartSidecar, relabel, request_ids

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
