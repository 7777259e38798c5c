"""Every pod's exported Parquet files (:mod:`slokit.store.lake_export`) read as one store.

:func:`open_lake` opens an in-memory DuckDB connection whose views are named like the
store's tables (``requests``, ``engine_samples``, ``gpu_samples``, ``scrapes``,
``findings``), each over ``read_parquet`` of that table's files with hive partitioning,
union by name, and every column cast back to the store's type; :class:`LakeReader` is the
:class:`~slokit.store.reader.LocalReader` over it, so analysis runs unchanged.

Partition pruning: the files are listed once, when the lake is opened (a reader sees the
lake as it was then), and each file's minute is read from its path. Before each question
the reader points the views of the tables it asks about at the files of the minutes the
question can touch: its window, widened by what the question looks back at (a counter's
previous sample, the buckets' lookback, requests still finishing in the window: at most
``lookback_s`` before it). Questions without a window (a request by id, the slowest
request) read every file.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

import duckdb

from slokit.errors import NotFound
from slokit.store import queries
from slokit.store.frames import data_bounds
from slokit.store.lake_export import TABLES
from slokit.store.reader import LocalReader

if TYPE_CHECKING:  # the frames are pandas DataFrames, built by DuckDB
    import pandas as pd

__all__ = ["LakeFile", "LakeReader", "open_lake", "store_columns"]

#: How far before a window a question may look: a request arriving before the window that
#: finishes in it, a counter's last sample before it, the newest time's requests.
LOOKBACK_S = 3600.0

_HIVE_TYPES = "{'date': DATE, 'hour': INTEGER, 'minute': INTEGER, 'replica': VARCHAR}"
_PART = re.compile(r"/(date|hour|minute)=([^/]+)(?=/)")
_GAP_SOURCES = {"requests": "requests", "spans": "requests", "engine": "engine_samples",
                "gpu": "gpu_samples"}  # fmt: skip


@dataclass(frozen=True)
class LakeFile:
    """One Parquet file and the span of time its partitions say it holds: ``[start, end)``
    (infinite where the path has no date, hour or minute)."""

    path: str
    start: float
    end: float

    @classmethod
    def parse(cls, path: str) -> LakeFile:
        parts = dict(_PART.findall(path.replace("\\", "/")))
        try:
            day = date.fromisoformat(parts["date"])
        except (KeyError, ValueError):
            return cls(path, -math.inf, math.inf)
        start = (day - date(1970, 1, 1)).days * 86400.0
        width = 86400.0
        if parts.get("hour", "").isdigit():
            start += int(parts["hour"]) * 3600
            width = 3600.0
            if parts.get("minute", "").isdigit():
                start += int(parts["minute"]) * 60
                width = 60.0
        return cls(path, start, start + width)


def store_columns() -> dict[str, list[tuple[str, str]]]:
    """The store's columns and types of every lake table, from an empty in-memory store
    (the migrations are the one definition of the schema), but the local store's bookkeeping
    (:attr:`LakeTable.local_only`)."""
    from slokit.store.db import open_store  # deferred: the writable store loads pyarrow

    with open_store(":memory:") as store:
        return {
            t.name: [
                (str(r[0]), str(r[1]))
                for r in store.con.execute(f"DESCRIBE {t.name}").fetchall()
                if r[0] not in t.local_only
            ]
            for t in TABLES
        }


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _list_files(con: duckdb.DuckDBPyConnection, root: str, table: str) -> list[LakeFile]:
    pattern = f"{root}/{table}/**/*.parquet"
    rows = con.execute(f"SELECT file FROM glob({_sql_str(pattern)}) ORDER BY file").fetchall()
    return [LakeFile.parse(str(f)) for (f,) in rows]


class LakeReader(LocalReader):
    """:class:`~slokit.store.reader.LocalReader` over the lake's views, pointed at the files
    each question needs first."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        files: Mapping[str, list[LakeFile]],
        columns: Mapping[str, list[tuple[str, str]]],
        *,
        lookback_s: float = LOOKBACK_S,
    ) -> None:
        super().__init__(con)
        self.files = dict(files)
        self.columns = dict(columns)
        self.lookback_s = lookback_s
        #: table -> the files its view reads now (until a question points it: none).
        self.scoped: dict[str, tuple[str, ...]] = {}
        for name, cols in self.columns.items():
            defs = ", ".join(f'"{c}" {t}' for c, t in cols)
            con.execute(f"CREATE TEMP TABLE _empty_{name} ({defs})")
            self._view(name, ())

    # -- views ---------------------------------------------------------------------------------
    def _scope(
        self, table: str, lo: float | None, hi: float | None, *, before: bool = False
    ) -> None:
        """Point ``table``'s view at the files whose minutes overlap ``[lo, hi]`` (``[lo, hi)``
        with ``before``: the question reads times before ``hi`` only)."""
        lo_, hi_ = -math.inf if lo is None else lo, math.inf if hi is None else hi
        paths = tuple(
            f.path
            for f in self.files[table]
            if f.end > lo_ and (f.start < hi_ if before else f.start <= hi_)
        )
        if self.scoped.get(table) != paths:
            self._view(table, paths)

    def _view(self, table: str, paths: tuple[str, ...]) -> None:
        casts = ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in self.columns[table])
        src = f"SELECT * FROM _empty_{table}"
        if paths:
            listed = ", ".join(_sql_str(p) for p in paths)
            src += (
                f" UNION ALL BY NAME SELECT * FROM read_parquet([{listed}], "
                f"hive_partitioning = true, union_by_name = true, hive_types = {_HIVE_TYPES})"
            )
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT {casts} FROM ({src})")
        self.scoped[table] = paths

    def _scope_all(self, lo: float | None, hi: float | None, *tables: str) -> None:
        for t in tables or tuple(self.files):
            self._scope(t, lo, hi)

    # -- extent --------------------------------------------------------------------------------
    def bounds(self) -> tuple[float | None, float | None]:
        """The oldest time is in the oldest minute's files; the newest in the last
        ``lookback_s`` of files (a request's finish is after its arrival's minute)."""
        tables = ("requests", "engine_samples", "gpu_samples")
        spans = [f for t in tables for f in self.files[t]]
        if not spans:
            return None, None
        first = min(f.start for f in spans)
        last = max(f.end for f in spans)
        self._scope_all(None, first, *tables)
        oldest = data_bounds(self.con)[0]
        self._scope_all(last - self.lookback_s, None, *tables)
        newest = data_bounds(self.con)[1]
        return oldest, newest

    # -- requests ------------------------------------------------------------------------------
    def request(self, request_id: str) -> dict[str, Any] | None:
        self._scope("requests", None, None)
        return super().request(request_id)

    def requests(self, since: float | None, until: float | None) -> list[dict[str, Any]]:
        self._scope("requests", since, until, before=True)
        return super().requests(since, until)

    def peer_count(self, since: float, until: float, slo_class: str | None) -> int:
        self._scope("requests", since, until)
        return super().peer_count(since, until, slo_class)

    def percentile_ranks(
        self,
        values: Mapping[str, float | None],
        since: float,
        until: float,
        slo_class: str | None,
        model: str | None = None,
    ) -> dict[str, Any]:
        self._scope("requests", since, until)
        return super().percentile_ranks(values, since, until, slo_class, model)

    def request_summary(self, replica: str | None, since: float, until: float) -> dict[str, Any]:
        self._scope("requests", since, until, before=True)
        return super().request_summary(replica, since, until)

    def request_summaries(self, since: float, until: float) -> dict[str, dict[str, Any]]:
        self._scope("requests", since, until, before=True)
        return super().request_summaries(since, until)

    def slowest_request(self, *, source: str = "vllm") -> str | None:
        self._scope("requests", None, None)
        return super().slowest_request(source=source)

    # -- window frames -------------------------------------------------------------------------
    def request_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame:
        self._scope("requests", origin, until, before=True)
        return super().request_buckets(origin, until, bucket_s)

    def finished_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame:
        self._scope(
            "requests", origin - self.lookback_s, until, before=True
        )  # finishing in the window
        return super().finished_buckets(origin, until, bucket_s)

    def engine_buckets(
        self, origin: float, until: float, bucket_s: float, lookback_s: float
    ) -> pd.DataFrame:
        self._scope("engine_samples", origin - lookback_s, until, before=True)
        return super().engine_buckets(origin, until, bucket_s, lookback_s)

    def gpu_buckets(
        self, origin: float, until: float, bucket_s: float, busy_util: float
    ) -> pd.DataFrame:
        self._scope("gpu_samples", origin, until, before=True)
        return super().gpu_buckets(origin, until, bucket_s, busy_util)

    # -- engine and GPU state ------------------------------------------------------------------
    def engine_window(self, replica: str, since: float, until: float) -> list[dict[str, Any]]:
        self._scope("engine_samples", since, until)
        return super().engine_window(replica, since, until)

    def engine_series(
        self, since: float | None, until: float | None
    ) -> dict[str, list[tuple[float, float | None, float | None]]]:
        self._scope("engine_samples", since, until)
        return super().engine_series(since, until)

    def has_engine_samples(self, replica: str) -> bool:
        self._scope("engine_samples", None, None)  # DuckDB prunes by the replica partition
        return super().has_engine_samples(replica)

    def engine_counter_increase(
        self, column: str, replica: str, since: float, until: float
    ) -> dict[str, Any]:
        # The increase starts at the last sample at or before ``since``: find it in the
        # lookback first, in the whole lake only when the lookback has none.
        col = queries.engine_counter(column)
        anchor: float | None = None
        for lo in (since - self.lookback_s, None):
            self._scope("engine_samples", lo, since)
            row = self.con.execute(
                f"SELECT epoch(max(ts)) FROM engine_samples WHERE replica = ? "
                f"AND {col} IS NOT NULL AND ts <= to_timestamp(?)",
                [replica, since],
            ).fetchone()
            if row and row[0] is not None:
                anchor = float(row[0])
                break
        self._scope("engine_samples", since if anchor is None else anchor, until)
        return super().engine_counter_increase(column, replica, since, until)

    def cache_config(self) -> dict[str, float] | None:
        spans = self.files["engine_samples"]
        if spans:
            self._scope("engine_samples", max(f.end for f in spans) - self.lookback_s, None)
            found = super().cache_config()
            if found is not None:
                return found
        self._scope("engine_samples", None, None)
        return super().cache_config()

    def gpu_state_at(self, replica: str, ts: float, *, max_age_s: float) -> dict[str, Any] | None:
        self._scope("gpu_samples", ts - max_age_s, ts)
        return super().gpu_state_at(replica, ts, max_age_s=max_age_s)

    def energy_increase(self, since: float | None, until: float | None) -> float | None:
        self._scope("gpu_samples", since, until)
        return super().energy_increase(since, until)

    # -- telemetry health ----------------------------------------------------------------------
    def last_seen(self, source: str, before: float) -> float | None:
        table = _GAP_SOURCES[source]
        self._scope(table, before - self.lookback_s, before)
        seen = super().last_seen(source, before)
        if seen is None:  # silent for the whole lookback: look further back
            self._scope(table, None, before)
            seen = super().last_seen(source, before)
        return seen

    def sample_gaps(
        self, source: str, since: float, until: float, *, stale_factor: float, min_gap_s: float
    ) -> list[tuple[str, float, float, float | None]]:
        self._scope(_GAP_SOURCES[source], since, until)
        return super().sample_gaps(
            source, since, until, stale_factor=stale_factor, min_gap_s=min_gap_s
        )

    def failed_scrapes(self, since: float, until: float) -> list[dict[str, Any]]:
        self._scope("scrapes", since, until)
        return super().failed_scrapes(since, until)

    # -- findings (partitioned by their end: one that ends after ``since`` may start before) --
    def findings_overlapping(
        self, replica: str | None, since: float, until: float
    ) -> list[dict[str, Any]]:
        self._scope("findings", since, None)
        return super().findings_overlapping(replica, since, until)

    def findings(
        self, since: float | None, until: float | None, limit: int = 200
    ) -> list[dict[str, Any]]:
        self._scope("findings", since, None)
        return super().findings(since, until, limit)


@contextmanager
def open_lake(
    source: str | os.PathLike[str], *, lookback_s: float = LOOKBACK_S
) -> Iterator[LakeReader]:
    """A :class:`LakeReader` over the lake at ``source`` (a directory, or any URL DuckDB
    reads: ``s3://bucket/lake`` with httpfs configured). NotFound when it holds no files."""
    root = os.fspath(source).rstrip("/") or "/"
    if "://" not in root and not os.path.isdir(root):
        raise NotFound(
            f"no lake at {root}: expected the directory a sidecar's --parquet-dir writes "
            "(<table>/date=.../hour=.../minute=.../replica=.../*.parquet)"
        )
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET parquet_metadata_cache = true")
        try:
            files = {t.name: _list_files(con, root, t.name) for t in TABLES}
        except duckdb.Error as exc:
            detail = str(exc).strip().split("\n", 1)[0]
            if "httpfs" in str(exc):  # a URL, and DuckDB could not load its extension for it
                detail = ("reading a lake at a URL needs DuckDB's httpfs extension, which is "
                          "not installed here and could not be downloaded")  # fmt: skip
            raise NotFound(f"cannot list the lake at {root}: {detail}") from exc
        if not any(files.values()):
            raise NotFound(
                f"no Parquet files in the lake at {root} (tables: "
                f"{', '.join(t.name for t in TABLES)}): has a sidecar with --parquet-dir "
                "exported a closed minute there yet?"
            )
        yield LakeReader(con, files, store_columns(), lookback_s=lookback_s)
    finally:
        con.close()
