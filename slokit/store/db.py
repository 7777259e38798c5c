"""The DuckDB store: one writer, batched Arrow appends inside transactions.

Open with :func:`open_store`. Appends are columnar (Arrow tables registered as views and
inserted set-wise), never row by row. Request fragments are deduplicated by ``fragment_id``
and merged into ``requests`` in the same transaction, so a reader never sees a fragment
without its merged row.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from slokit.errors import BadInput, StoreBusy
from slokit.records import (
    FRAGMENT_FIELDS,
    EngineSample,
    Finding,
    GpuSample,
    RequestFragment,
    ScrapeResult,
)
from slokit.store.merge import merge_sql, sql_string_list
from slokit.store.migrations import MIGRATIONS

_TS = pa.timestamp("us", tz="UTC")

#: Request ids merged per statement: small enough that DuckDB looks them up in the ART indexes
#: (index_scan_max_count defaults to 2048) instead of scanning tables that grow without bound.
MERGE_CHUNK = 2000
#: One index lookup costs about as much as scanning this many rows (measured on DuckDB 2.0).
INDEX_LOOKUP_COST_ROWS = 700

_FRAGMENT_TYPES: dict[str, pa.DataType] = {
    "request_id": pa.string(),
    "source": pa.string(),
    "fragment_id": pa.string(),
    "prompt_tokens": pa.int64(),
    "output_tokens": pa.int64(),
    "cached_tokens": pa.int64(),
    "max_tokens": pa.int64(),
    "preemptions": pa.int64(),
    "http_status": pa.int32(),
    "quality_pass": pa.bool_(),
}
for _name in FRAGMENT_FIELDS:
    if _name.endswith("_ts"):
        _FRAGMENT_TYPES[_name] = _TS
    elif _name.endswith("_s"):
        _FRAGMENT_TYPES[_name] = pa.float64()
    else:
        _FRAGMENT_TYPES.setdefault(_name, pa.string())


def _run(con: duckdb.DuckDBPyConnection, sql: str, params: Any = None) -> None:
    """Execute a statement and consume its result (DuckDB 2 refuses further work on a
    connection whose last result is unfinished)."""
    con.execute(sql, params).fetchall()


def _ts_us(values: Sequence[float | None]) -> pa.Array:
    return pa.array([None if v is None else int(v * 1_000_000) for v in values], type=_TS)


def _column(name: str, values: list[Any]) -> pa.Array:
    typ = _FRAGMENT_TYPES[name]
    if typ == _TS:
        return _ts_us(values)
    return pa.array(values, type=typ)


@dataclass(frozen=True)
class AppendResult:
    received: int
    new: int
    requests_touched: int


class Store:
    """A DuckDB file holding slokit's records. Not thread-safe for concurrent writers:
    the sidecar funnels writes through one writer; readers use :meth:`cursor`."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        path: str,
        read_only: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.con = con
        self.path = path
        self.read_only = read_only
        self.clock = clock
        self._lock = threading.RLock()
        self._rows_estimate: int | None = None  # fragments stored, to choose a merge plan

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:  # never under a transaction another thread has open
            self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_version(self) -> int:
        rows = self.con.execute("SELECT max(version) FROM schema_migrations").fetchall()
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def migrate(self) -> list[int]:
        """Apply pending migrations in order; returns the versions applied."""
        _run(
            self.con,
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMPTZ NOT NULL)",
        )
        current = self.schema_version()
        applied = []
        for m in MIGRATIONS:
            if m.version <= current:
                continue
            with self.transaction():
                _run(self.con, m.sql)
                _run(
                    self.con,
                    "INSERT INTO schema_migrations VALUES (?, ?, to_timestamp(?))",
                    [m.version, m.name, self.clock()],
                )
            applied.append(m.version)
        return applied

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._lock:
            _run(self.con, "BEGIN TRANSACTION")
            try:
                yield self.con
            except BaseException:
                _run(self.con, "ROLLBACK")
                raise
            _run(self.con, "COMMIT")

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for reads from another thread (same database, own connection state)."""
        return self.con.cursor()

    # -- appends ---------------------------------------------------------------------------
    def append_fragments(self, fragments: Sequence[RequestFragment]) -> AppendResult:
        """Store fragments (deduplicated by fragment_id) and re-merge their requests."""
        if not fragments:
            return AppendResult(0, 0, 0)
        cols = {
            name: _column(name, [getattr(f, name) for f in fragments]) for name in FRAGMENT_FIELDS
        }
        return self.append_fragment_table(pa.table(cols))

    def append_fragment_table(self, table: pa.Table) -> AppendResult:
        """Columnar form of :meth:`append_fragments` (columns named as RequestFragment)."""
        n = table.num_rows
        if n == 0:
            return AppendResult(0, 0, 0)
        cols = ", ".join(FRAGMENT_FIELDS)
        now = self.clock()
        with self.transaction() as con:
            con.register("_batch", table)
            try:
                before = self._count(con, "request_fragments")
                # Within one batch, keep the first copy of a fragment id.
                _run(
                    con,
                    f"""
                    INSERT OR IGNORE INTO request_fragments (ingested_at, {cols})
                    SELECT to_timestamp(?), {cols} FROM (
                        SELECT *, row_number() OVER (PARTITION BY fragment_id) AS _rn FROM _batch
                    ) WHERE _rn = 1
                    """,
                    [now],
                )
                new = self._count(con, "request_fragments") - before
                if self._rows_estimate is not None:
                    self._rows_estimate += new
                ids = pc.unique(table.column("request_id"))
                touched = len(ids)
                self._merge(con, ids)
            finally:
                con.unregister("_batch")
        return AppendResult(n, new, touched)

    def _merge(self, con: duckdb.DuckDBPyConnection, ids: pa.Array) -> None:
        """Re-merge the ``requests`` rows of ``ids`` from all their fragments.

        Two plans with the same result: a few ids against a big table are looked up in the ART
        indexes (constant IN lists); many ids, or a small table, are joined in one scan.
        """
        if self._rows_estimate is None:
            self._rows_estimate = self._count(con, "request_fragments")
        if len(ids) * INDEX_LOOKUP_COST_ROWS < self._rows_estimate:
            values = ids.to_pylist()
            for i in range(0, len(values), MERGE_CHUNK):
                pred = f"request_id IN ({sql_string_list(values[i : i + MERGE_CHUNK])})"
                _run(con, f"DELETE FROM requests WHERE {pred}")
                _run(con, "INSERT INTO requests " + merge_sql(pred))
        else:
            con.register("_ids", pa.table({"request_id": ids}))
            try:
                pred = "request_id IN (SELECT request_id FROM _ids)"
                _run(con, f"DELETE FROM requests WHERE {pred}")
                _run(con, "INSERT INTO requests " + merge_sql(pred))
            finally:
                con.unregister("_ids")

    @staticmethod
    def _count(con: duckdb.DuckDBPyConnection, table: str) -> int:
        rows = con.execute(f"SELECT count(*) FROM {table}").fetchall()
        return int(rows[0][0])

    def _append_rows(self, table: str, columns: dict[str, pa.Array]) -> int:
        t = pa.table(columns)
        if t.num_rows == 0:
            return 0
        names = ", ".join(columns)
        with self.transaction() as con:
            con.register("_rows", t)
            try:
                _run(con, f"INSERT INTO {table} ({names}) SELECT {names} FROM _rows")
            finally:
                con.unregister("_rows")
        return t.num_rows

    def append_engine_samples(self, samples: Sequence[EngineSample]) -> int:
        if not samples:
            return 0
        scalar = [
            "running", "waiting", "kv_usage_ratio", "preemptions_total", "prompt_tokens_total",
            "generation_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
            "request_success_total", "spec_decode_drafts_total",
            "spec_decode_draft_tokens_total", "spec_decode_accepted_tokens_total",
            "num_gpu_blocks", "block_size",
        ]  # fmt: skip
        cols: dict[str, pa.Array] = {
            "ts": _ts_us([s.ts for s in samples]),
            "replica": pa.array([s.replica for s in samples], pa.string()),
            "model": pa.array([s.model for s in samples], pa.string()),
            "engine": pa.array([s.engine for s in samples], pa.string()),
        }
        for name in scalar:
            cols[name] = pa.array([getattr(s, name) for s in samples], pa.float64())
        cols["request_success_by_reason"] = pa.array(
            [list(s.request_success_by_reason.items()) for s in samples],
            pa.map_(pa.string(), pa.float64()),
        )
        hist = [(s, h) for s in samples for h in s.histograms.values()]
        with self._lock:
            n = self._append_rows("engine_samples", cols)
            if hist:
                self._append_rows(
                    "histogram_samples",
                    {
                        "ts": _ts_us([s.ts for s, _ in hist]),
                        "replica": pa.array([s.replica for s, _ in hist], pa.string()),
                        "model": pa.array([s.model for s, _ in hist], pa.string()),
                        "metric": pa.array([h.metric for _, h in hist], pa.string()),
                        "upper_bounds": pa.array(
                            [h.upper_bounds for _, h in hist], pa.list_(pa.float64())
                        ),
                        "cumulative_counts": pa.array(
                            [h.cumulative_counts for _, h in hist], pa.list_(pa.float64())
                        ),
                        "sum": pa.array([h.sum for _, h in hist], pa.float64()),
                        "count": pa.array([h.count for _, h in hist], pa.float64()),
                    },
                )
        return n

    def append_gpu_samples(self, samples: Sequence[GpuSample]) -> int:
        if not samples:
            return 0
        strings = ["node", "gpu", "uuid", "gpu_model", "replica", "namespace", "source"]
        floats = [
            "util_ratio", "mem_used_mib", "mem_total_mib", "power_w", "temperature_c",
            "sm_clock_mhz", "dram_active_ratio", "tensor_active_ratio",
            "gr_engine_active_ratio", "energy_j", "xid_last",
        ]  # fmt: skip
        cols: dict[str, pa.Array] = {"ts": _ts_us([s.ts for s in samples])}
        cols.update({n: pa.array([getattr(s, n) for s in samples], pa.string()) for n in strings})
        cols.update({n: pa.array([getattr(s, n) for s in samples], pa.float64()) for n in floats})
        return self._append_rows("gpu_samples", cols)

    def append_scrapes(self, results: Sequence[ScrapeResult]) -> int:
        if not results:
            return 0
        return self._append_rows(
            "scrapes",
            {
                "ts": _ts_us([r.ts for r in results]),
                "target": pa.array([r.target for r in results], pa.string()),
                "kind": pa.array([r.kind for r in results], pa.string()),
                "replica": pa.array([r.replica for r in results], pa.string()),
                "up": pa.array([r.up for r in results], pa.bool_()),
                "duration_s": pa.array([r.duration_s for r in results], pa.float64()),
                "error": pa.array([r.error for r in results], pa.string()),
                "samples": pa.array([r.samples for r in results], pa.int32()),
            },
        )

    def append_findings(self, findings: Sequence[Finding]) -> int:
        if not findings:
            return 0
        now = self.clock()
        return self._append_rows(
            "findings",
            {
                "rule": pa.array([f.rule for f in findings], pa.string()),
                "severity": pa.array([f.severity for f in findings], pa.string()),
                "confidence": pa.array([f.confidence for f in findings], pa.float64()),
                "replica": pa.array([f.replica for f in findings], pa.string()),
                "start_ts": _ts_us([f.start_ts for f in findings]),
                "end_ts": _ts_us([f.end_ts for f in findings]),
                "summary": pa.array([f.summary for f in findings], pa.string()),
                "evidence": pa.array(
                    [json.dumps(f.evidence, default=str) for f in findings], pa.string()
                ),
                "runbook": pa.array([f.runbook for f in findings], pa.string()),
                "created_at": _ts_us([now] * len(findings)),
            },
        )

    def record_rejection(self, source: str, reason: str, count: int, detail: str | None) -> None:
        with self.transaction() as con:
            _run(
                con,
                "INSERT INTO ingest_rejections VALUES (to_timestamp(?), ?, ?, ?, ?)",
                [self.clock(), source, reason, count, detail],
            )


def open_store(
    path: str | Path,
    *,
    read_only: bool = False,
    clock: Callable[[], float] = time.time,
) -> Store:
    """Open (creating and migrating if needed) the DuckDB file at ``path``.

    Raises :class:`StoreBusy` when another process holds the file (a running sidecar): ask
    its API instead. ``read_only`` requires an existing file.
    """
    p = str(path)
    if read_only and p != ":memory:" and not Path(p).exists():
        raise BadInput(f"no slokit database at {p} (ingest something first, or pass --db)")
    try:
        con = duckdb.connect(p, read_only=read_only)
    except duckdb.IOException as exc:
        msg = str(exc)
        if "lock" in msg.lower():
            raise StoreBusy(
                f"{p} is held by another process (a running sidecar?); "
                "ask it with --sidecar URL instead"
            ) from None
        raise BadInput(f"cannot open {p}: {msg}") from None
    except duckdb.Error as exc:
        raise BadInput(f"cannot open {p} as a DuckDB database: {exc}") from None
    _run(con, "SET TimeZone = 'UTC'")
    store = Store(con, p, read_only, clock)
    if not read_only:
        store.migrate()
    elif store_version(con) == 0:
        con.close()
        raise BadInput(f"{p} is not a slokit database (no schema)")
    return store


def store_version(con: duckdb.DuckDBPyConnection) -> int:
    try:
        rows = con.execute("SELECT max(version) FROM schema_migrations").fetchall()
    except duckdb.CatalogException:
        return 0
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0
