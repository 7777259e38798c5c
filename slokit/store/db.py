"""The DuckDB store: one writer, batched Arrow appends inside transactions.

Open with :func:`open_store`. Appends are columnar (Arrow tables inserted set-wise, see
:mod:`slokit.store.append`), never row by row. Request fragments are deduplicated by
``fragment_id`` and merged into ``requests`` in the same transaction, so a reader never sees a
fragment without its merged row.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from slokit.errors import BadInput, StoreBusy
from slokit.records import (
    EngineSample,
    Finding,
    GpuSample,
    RequestFragment,
    RouterSample,
    ScrapeResult,
)
from slokit.store import _router
from slokit.store import append as _append
from slokit.store.append import AppendResult, ts_array
from slokit.store.faults import (
    StorageFault,
    is_damage,
    missing_blocks_reason,
    storage_fault,
    truncation_reason,
)
from slokit.store.migrations import LATEST_VERSION, MIGRATIONS
from slokit.store.reader import LocalReader

log = logging.getLogger("slokit.store")


def _run(con: duckdb.DuckDBPyConnection, sql: str, params: Any = None) -> None:
    """Execute a statement and consume its result (DuckDB 2 refuses further work on a
    connection whose last result is unfinished)."""
    con.execute(sql, params).fetchall()


_ts_us = ts_array


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
        self._checked_batches_left = 0  # > 0: fragment batches take the checked path
        #: Why the last write failed when the storage (not the data) is at fault: until a
        #: write succeeds again (a full volume), or for good (a damaged file: a write that
        #: avoids the damaged blocks proves nothing). The sidecar's /readyz reports it.
        self.storage_error: str | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Checkpoint (a writable file: its WAL moves into the file) and close."""
        with self._lock:  # never under a transaction another thread has open
            if not self.read_only and self.path != ":memory:":
                try:
                    _run(self.con, "CHECKPOINT")
                except duckdb.Error as exc:  # INFO: a command has already said what failed
                    log.info("%s: checkpoint before close failed (the WAL keeps the rows "
                             "until the next open): %s", self.path, exc)  # fmt: skip
            self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_version(self) -> int:
        rows = self.con.execute("SELECT max(version) FROM schema_migrations").fetchall()
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def migrate(self) -> list[int]:
        """Apply pending migrations in order; returns the versions applied.

        Refuses (BadInput, writing nothing) a file that holds tables but no
        ``schema_migrations`` (not slokit's) or a schema newer than this code knows."""
        _check_schema(self.con, self.path)
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
            except BaseException as exc:
                self._note_storage(exc)
                _run(self.con, "ROLLBACK")
                raise
            try:
                _run(self.con, "COMMIT")
            except duckdb.Error as exc:
                if self._note_storage(exc):  # disk full, I/O: an error of the storage
                    msg = f"{self.path}: commit failed: {self.storage_error}"
                    raise StorageFault(msg) from None
                raise
            if self.storage_error is not None and not is_damage(self.storage_error):
                log.info("%s: writes succeed again (after: %s)", self.path, self.storage_error)
                self.storage_error = None

    def _note_storage(self, exc: BaseException) -> bool:
        """Remember ``exc`` when it is a fault of the storage; True if it is. (The caller
        reports the error itself: the sidecar's writer logs it, a command prints it.)"""
        fault = storage_fault(exc)
        if fault is not None and not (self.storage_error and is_damage(self.storage_error)):
            self.storage_error = fault
        return fault is not None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for reads from another thread (same database, own connection state)."""
        return self.con.cursor()

    def answers(self) -> bool:
        """Whether the database answers a query (the readiness probe's check)."""
        try:
            cur = self.con.cursor()
            try:
                cur.execute("SELECT 1").fetchone()
            finally:
                cur.close()
        except Exception:
            return False
        return True

    def reader(self) -> LocalReader:
        """The :class:`~slokit.store.reader.Reader` analysis asks its questions through."""
        return LocalReader(self.con)

    # -- appends ---------------------------------------------------------------------------
    def append_fragments(self, fragments: Sequence[RequestFragment]) -> AppendResult:
        """Store fragments (deduplicated by request id and fragment_id) and merge their
        requests."""
        if not fragments:
            return AppendResult(0, 0, 0)
        return self.append_fragment_table(_append.fragments_table(fragments))

    def append_fragment_table(self, table: pa.Table) -> AppendResult:
        """Columnar form of :meth:`append_fragments` (columns named as RequestFragment)."""
        return _append.append_fragment_table(self, table)

    def _merge(self, con: duckdb.DuckDBPyConnection, ids: pa.Array) -> None:
        """Re-merge the ``requests`` rows of ``ids`` from all their fragments."""
        _append.merge_existing(self, con, ids)

    @staticmethod
    def _count(con: duckdb.DuckDBPyConnection, table: str) -> int:
        return _append.count_rows(con, table)

    def _append_rows(self, table: str, columns: dict[str, pa.Array]) -> int:
        return _append.append_table(self, table, pa.table(columns))

    def append_engine_samples(self, samples: Sequence[EngineSample]) -> int:
        """One row per sample, its histograms in the row (``histogram_samples`` is a view)."""
        if not samples:
            return 0
        return _append.append_engine_samples(self, samples)

    def append_router_samples(self, samples: Sequence[RouterSample]) -> int:
        """One row per (router, pool, model) sample, its histograms in the row."""
        if not samples:
            return 0
        return _router.append_router_samples(self, samples)

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
        return self._append_rows("findings", self._findings_columns(findings))

    def _findings_columns(self, findings: Sequence[Finding]) -> dict[str, pa.Array]:
        now = self.clock()
        return {
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
        }

    def replace_findings(
        self, findings: Sequence[Finding], window: tuple[float, float] | None = None
    ) -> int:
        """Store a diagnosis's findings. With ``window`` (the diagnosis's), what an earlier
        run said about that time is replaced, in one transaction:

        - its findings for a span inside the window are dropped (re-running a diagnosis over
          the same data does not duplicate them);
        - one of the same rule and replica whose span overlaps a new finding's is the same
          episode: it is dropped and the new finding (from the run that saw the most) starts
          when the earliest of them started. A sidecar diagnosing a sliding window every 30 s
          thus keeps one finding for an incident that lasts hours, not one a tick, and keeps
          when it began.

        Without ``window`` the findings are appended as they are."""
        if window is None:
            return self.append_findings(findings)
        episode = (
            "rule = ? AND replica IS NOT DISTINCT FROM ? "
            "AND start_ts <= to_timestamp(?) AND end_ts >= to_timestamp(?)"
        )
        with self.transaction() as con:
            con.execute(
                "DELETE FROM findings WHERE start_ts >= to_timestamp(?) "
                "AND end_ts <= to_timestamp(?)",
                [window[0], window[1]],
            )
            kept: list[Finding] = []
            for f in findings:
                params = [f.rule, f.replica, f.end_ts, f.start_ts]
                began = con.execute(
                    f"DELETE FROM findings WHERE {episode} RETURNING epoch(start_ts)", params
                ).fetchall()
                if began:
                    f = dataclasses.replace(f, start_ts=min(f.start_ts, *(b[0] for b in began)))
                kept.append(f)
            if kept:
                _append.insert_table(con, "findings", pa.table(self._findings_columns(kept)))
        return len(kept)

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
    verify: bool = False,
    settings: Mapping[str, Any] | None = None,
) -> Store:
    """Open (creating and migrating if needed) the DuckDB file at ``path``.

    Raises :class:`StoreBusy` when another process holds the file (a running sidecar): ask
    its API instead. ``read_only`` requires an existing file. A file that is truncated or
    unreadable, that is not slokit's (tables but no ``schema_migrations``: left untouched)
    or whose schema is newer than this code is :class:`BadInput` with the reason.
    ``verify`` also checks that every table's blocks are in the file (about 0.2 s per GB).
    ``settings`` are DuckDB options given at connect (``threads``, ``async_threads``: pools
    that DuckDB starts there, so setting them later would start them first).
    """
    p = str(path)
    if read_only and p != ":memory:" and not Path(p).exists():
        raise BadInput(f"no slokit database at {p} (ingest something first, or pass --db)")
    try:
        config = {**_thread_config(), **(settings or {})}
        con = duckdb.connect(p, read_only=read_only, config=config)
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
    try:
        _run(con, "SET TimeZone = 'UTC'")
        if p != ":memory:":
            damage = truncation_reason(con, p)
            if damage is None and verify:
                damage = missing_blocks_reason(con, p)
            if damage:
                raise BadInput(f"{p} is damaged: {damage}; restore it or move it aside")
        store = Store(con, p, read_only, clock)
        if not read_only:
            store.migrate()
        elif _check_schema(con, p) == 0:
            raise BadInput(f"{p} is not a slokit database (no schema)")
    except BaseException as exc:
        con.close()
        if isinstance(exc, duckdb.Error | StorageFault):
            raise BadInput(f"cannot use {p}: {_first_line(exc)}") from None
        raise
    return store


def _thread_config() -> dict[str, Any]:
    """DuckDB's threads, bounded by the CPUs this process may run on. DuckDB counts the
    machine's cores and ignores the affinity mask (``taskset``, a container's cpuset), so a
    process pinned to one core would otherwise run two or more workers that take turns on it
    (about 10% of an ingest's time on a 2-core machine, ``benchmarks/ingest_otlp.py``), and
    four async I/O threads per core of the machine."""
    if not hasattr(os, "sched_getaffinity"):
        return {}
    allowed = len(os.sched_getaffinity(0))
    if allowed >= (os.cpu_count() or allowed):
        return {}
    return {"threads": allowed, "async_threads": allowed}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def store_version(con: duckdb.DuckDBPyConnection) -> int:
    try:
        rows = con.execute("SELECT max(version) FROM schema_migrations").fetchall()
    except duckdb.CatalogException:
        return 0
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


def _check_schema(con: duckdb.DuckDBPyConnection, path: str) -> int:
    """The file's schema version; BadInput for a file that is not slokit's or is newer."""
    version = store_version(con)
    if version == 0:
        rows = con.execute(
            "SELECT schema_name || '.' || table_name FROM duckdb_tables() "
            "WHERE database_name = current_database() AND NOT temporary ORDER BY 1"
        ).fetchall()
        tables = [r[0] for r in rows if r[0] != "main.schema_migrations"]
        if tables:
            more = f" and {len(tables) - 5} more" if len(tables) > 5 else ""
            shown = ", ".join(tables[:5]) + more
            raise BadInput(
                f"{path} is not a slokit database: it holds other tables ({shown}) and no "
                "schema_migrations; refusing to write into it (pass another --db)"
            )
    elif version > LATEST_VERSION:
        raise BadInput(
            f"{path} has schema version {version}, newer than this slokit knows "
            f"({LATEST_VERSION}): upgrade slokit to use it"
        )
    return version
