"""Hourly Parquet export of closed hours in hive layout, readable across pods by DuckDB."""

from __future__ import annotations

from pathlib import Path

import duckdb

from slokit.store.lake_export import ParquetExporter
from slokit.sources.otlp import decode_traces
from slokit.store.db import open_store


def test_closed_hours_are_exported_once_in_hive_layout(tmp_path: Path, export_body: bytes) -> None:
    store = open_store(tmp_path / "p.duckdb")
    store.append_fragments(decode_traces(export_body, default_replica="pod-a").fragments)
    (newest,) = store.con.execute("SELECT epoch(max(arrival_ts)) FROM requests").fetchall()[0]
    out = tmp_path / "parquet"
    now = [newest]  # the hour of the data is still open
    exp = ParquetExporter(str(out), grace_s=600, clock=lambda: now[0])
    assert exp.export_closed_hours(store.con) == []
    now[0] = newest + 3600 + 600
    written = exp.export_closed_hours(store.con)
    assert [w.split("/")[0] for w in written] == ["requests"]
    files = sorted(p.relative_to(out / "requests").as_posix() for p in out.rglob("*.parquet"))
    assert len(files) == 1
    date, hour, replica, _ = files[0].split("/")
    assert date.startswith("date=") and hour.startswith("hour=") and replica == "replica=pod-a"
    rows = duckdb.execute(
        f"SELECT count(*), any_value(replica) FROM read_parquet('{out}/requests/**/*.parquet', "
        "hive_partitioning = true)"
    ).fetchone()
    assert rows == (64, "pod-a")
    assert exp.export_closed_hours(store.con) == []  # once
    store.close()
