"""Hourly Parquet export of closed hours, hive layout ``<table>/date=/hour=/replica=/``.

An hour is closed ``grace_s`` after it ends (late fragments have arrived). Each closed hour
is written once per table; a marker file ``_exported/<table>/<date>T<hour>`` records it.
File names are deterministic per partition, so an export interrupted before its marker is
simply redone (overwriting, never duplicating). The target is a directory, or any URL
DuckDB's COPY can write (``s3://...`` with the httpfs extension configured).
DuckDB then queries the fleet's files as one table::

    SELECT * FROM read_parquet('DIR/requests/**/*.parquet', hive_partitioning = true)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

log = logging.getLogger("slokit.store.lake_export")

#: table -> its time column.
TABLES: dict[str, str] = {"requests": "arrival_ts", "engine_samples": "ts", "gpu_samples": "ts"}


class ParquetExporter:
    def __init__(self, out: str, *, grace_s: float = 600.0,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.out = out.rstrip("/")
        self.grace_s = grace_s
        self.clock = clock
        self._markers = Path(self.out) / "_exported" if "://" not in self.out else None

    def _done(self, table: str, key: str) -> bool:
        return self._markers is not None and (self._markers / table / key).exists()

    def _mark(self, table: str, key: str) -> None:
        if self._markers is not None:
            (self._markers / table).mkdir(parents=True, exist_ok=True)
            (self._markers / table / key).touch()

    def export_closed_hours(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """Write every closed, not yet exported hour; returns ``table/<date>T<hour>`` keys."""
        cut = self.clock() - self.grace_s
        written: list[str] = []
        for table, col in TABLES.items():
            hours = con.execute(
                f"SELECT DISTINCT epoch(date_trunc('hour', {col})) FROM {table} "
                f"WHERE {col} IS NOT NULL AND {col} + INTERVAL 1 HOUR <= to_timestamp(?) "
                "ORDER BY 1",
                [cut],
            ).fetchall()
            for (start,) in hours:
                key = time.strftime("%Y-%m-%dT%H", time.gmtime(start))
                if self._done(table, key):
                    continue
                if self._markers is not None:
                    Path(self.out).mkdir(parents=True, exist_ok=True)
                dest = f"{self.out}/{table}".replace("'", "''")
                con.execute(
                    f"""
                    COPY (
                        SELECT * EXCLUDE (replica), strftime({col}, '%Y-%m-%d') AS date,
                               hour({col}) AS hour, coalesce(replica, 'unknown') AS replica
                        FROM {table}
                        WHERE {col} >= to_timestamp(?) AND {col} < to_timestamp(?) + INTERVAL 1 HOUR
                    ) TO '{dest}' (FORMAT parquet, PARTITION_BY (date, hour, replica),
                                   FILENAME_PATTERN 'part_{{i}}', OVERWRITE_OR_IGNORE true)
                    """,
                    [start, start],
                )
                self._mark(table, key)
                written.append(f"{table}/{key}")
        if written:
            log.info("parquet export: %s", ", ".join(written))
        return written
