"""The sidecar's Parquet export of closed minutes: the lake every pod writes and
``slokit ... --lake DIR`` reads (:mod:`slokit.store.lake`).

Layout (plain hive, one file per table, minute, replica and writing sidecar)::

    <out>/<table>/date=YYYY-MM-DD/hour=HH/minute=MM/replica=R/part_<writer>.parquet

Times are UTC. ``R`` is the replica percent-encoded (``/``, ``=``, spaces...), and a NULL
replica (a client-only record, a fleet-wide finding) is ``__HIVE_DEFAULT_PARTITION__``: both
are what DuckDB writes and reads back, so NULL and every string survive the round trip.
The replica is a partition only, not a column of the files (as hive engines expect).

A minute is closed ``grace_s`` after it ends: late fragments and scrapes have arrived. Each
tick writes the closed minutes not yet written, at most ``max_minutes`` per table, oldest
first (a sidecar that was down catches up over a few ticks). Rows of the minute being
written are the rows whose time column (:data:`TABLES`) falls in it; rows without a time are
not exported.

Requests and findings can still change once written: a long request's record completes
when it finishes, a finding is replaced by the next diagnosis. For ``revisit_s`` after a
minute was written, each tick compares the minute's fingerprint (rows, and the sum of their
``updated_at``/``created_at``) with the one written; a minute that changed is written again,
whole, and a replica that no longer has rows there loses its file.

A request can change, or first reach the store, later still: a request longer than the
revisits (its record completes when it finishes), a sender whose clock is behind, spans
resent after an outage. Rows of ``requests`` stamped (``updated_at``) after what the last
tick looked at, in a minute no longer revisited, are merged into that minute's file instead:
the file's rows are kept except those the store holds now, which replace them (the store may
have deleted the others, so the minute is never written again from the store alone).

Idempotent: the state file ``<out>/_exported/<writer>.json`` (the markers: the first minute
not yet written per table, the fingerprints of recent minutes, how far late changes were
looked for and the minutes waiting to have them merged) is saved after each minute. File names are deterministic, so an export interrupted before its marker is redone,
overwriting, never duplicating; a local file is written beside its place and renamed into
it, so readers never see half a file. The target may be any URL DuckDB's COPY writes
(``s3://...`` with httpfs configured); its state then lives at ``state_path`` (or in memory:
after a restart the minutes still in the store are written again, harmlessly).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb

from slokit.store.migrations import LOCAL_REQUEST_COLUMNS

log = logging.getLogger("slokit.store.lake_export")

__all__ = [
    "NULL_PARTITION",
    "TABLES",
    "LakeTable",
    "ParquetExporter",
    "minute_dir",
    "partition_value",
]


@dataclass(frozen=True)
class LakeTable:
    """A store table the lake holds: the column its minutes are cut by, and the column that
    changes when a written row changes (None: rows never change once the minute closed)."""

    name: str
    time_column: str
    stamp_column: str | None = None
    #: Columns the lake leaves out: the local store's bookkeeping.
    local_only: tuple[str, ...] = ()
    #: The column that names a row (a late change is merged into its minute's file by it);
    #: None: late changes are not merged (a finding is replaced, not updated).
    key: str | None = None

    def columns(self) -> str:
        """The select list of a partition: every column but ``replica`` (the partition's key)
        and the local ones."""
        return f"* EXCLUDE ({', '.join(('replica', *self.local_only))})"


#: The tables in the lake, in export order.
TABLES: tuple[LakeTable, ...] = (
    LakeTable("requests", "arrival_ts", "updated_at", LOCAL_REQUEST_COLUMNS, key="request_id"),
    LakeTable("engine_samples", "ts"),
    LakeTable("gpu_samples", "ts"),
    LakeTable("scrapes", "ts"),
    LakeTable("findings", "end_ts", "created_at"),
)

#: At most this many minutes wait to have late changes merged (a week of minutes); past it
#: the oldest are given up, with a warning (a sender stamping every span in another old
#: minute must not grow the markers without bound).
MAX_LATE_MINUTES = 10_080

#: The partition value of a NULL replica (hive's and DuckDB's convention).
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def partition_value(replica: str | None) -> str:
    """``replica=`` directory value: percent-encoded, NULL as :data:`NULL_PARTITION`."""
    return NULL_PARTITION if replica is None else quote(replica, safe="")


def minute_dir(minute: int) -> str:
    """``date=YYYY-MM-DD/hour=HH/minute=MM`` of the minute ``minute`` (epoch minutes, UTC)."""
    return time.strftime("date=%Y-%m-%d/hour=%H/minute=%M", time.gmtime(minute * 60))


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


@dataclass
class _Written:
    """What a minute of a changeable table held when it was written."""

    fingerprint: list[str]
    replicas: list[str | None]


@dataclass
class _TableState:
    through: int | None = None  # every minute before this one is written (epoch minutes)
    recent: dict[int, _Written] = field(default_factory=dict)
    # minutes before this one are no longer revisited, however recent (stop_revisiting)
    revisit_from: int | None = None
    # the newest stamp (epoch microseconds) a tick has looked for late changes up to
    seen_to: int | None = None
    # minutes no longer revisited that changed since they were written: merged, oldest first
    late: set[int] = field(default_factory=set)


class ParquetExporter:
    """Writes the store's closed minutes to ``out`` (see the module docstring)."""

    def __init__(
        self,
        out: str,
        *,
        grace_s: float = 50.0,
        writer: str | None = None,
        max_minutes: int = 60,
        revisit_s: float = 1800.0,
        state_path: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.out = out.rstrip("/")
        self.grace_s = grace_s
        self.writer = writer or os.environ.get("POD_NAME") or socket.gethostname()
        self.max_minutes = max_minutes
        self.revisit_minutes = math.ceil(revisit_s / 60)
        self.clock = clock
        self.local = "://" not in self.out
        self._file = f"part_{quote(self.writer, safe='')}.parquet"
        if state_path is None and self.local:
            state_path = str(Path(self.out) / "_exported" / f"{quote(self.writer, safe='')}.json")
        self._state_path = Path(state_path) if state_path else None
        self._state: dict[str, _TableState] | None = None
        # held by a tick and by whoever deletes rows the lake may still write (paused())
        self._lock = threading.Lock()

    # -- markers -----------------------------------------------------------------------------
    def _load(self) -> dict[str, _TableState]:
        state = {t.name: _TableState() for t in TABLES}
        if self._state_path is None or not self._state_path.exists():
            return state
        try:
            doc = json.loads(self._state_path.read_text(encoding="utf-8"))
            for name, st in doc["tables"].items():
                if name in state:
                    state[name] = _TableState(
                        through=st["through"],
                        recent={
                            int(m): _Written(w["fingerprint"], w["replicas"])
                            for m, w in st["recent"].items()
                        },
                        revisit_from=st.get("revisit_from"),
                        seen_to=st.get("seen_to"),
                        late={int(m) for m in st.get("late", [])},
                    )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("parquet export: unreadable %s (%s): writing again", self._state_path, exc)
            return {t.name: _TableState() for t in TABLES}
        return state

    def _save(self, state: dict[str, _TableState]) -> None:
        if self._state_path is None:
            return
        doc: dict[str, Any] = {
            "version": 1,
            "tables": {
                name: {
                    "through": st.through,
                    "revisit_from": st.revisit_from,
                    "seen_to": st.seen_to,
                    "late": sorted(st.late),
                    "recent": {
                        str(m): {"fingerprint": w.fingerprint, "replicas": w.replicas}
                        for m, w in sorted(st.recent.items())
                    },
                }
                for name, st in state.items()
            },
        }
        self._state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._state_path.with_name(self._state_path.name + ".tmp")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, self._state_path)

    def settled_before(self, table: str) -> float | None:
        """Epoch seconds before which every row of ``table`` (by its time column) is written
        and no longer revisited: rows the store may delete without the lake losing them. None
        until this exporter has written or loaded its markers."""
        st = (self._state or {}).get(table)
        if st is None or st.through is None:
            return None
        return 60.0 * min((st.through, *st.recent))

    def written_before(self, table: str) -> float:
        """Epoch seconds before which every minute of ``table`` is written (0: none yet)."""
        st = (self._state or {}).get(table)
        return 0.0 if st is None or st.through is None else 60.0 * st.through

    @contextmanager
    def paused(self, timeout_s: float) -> Iterator[bool]:
        """No tick runs inside this block (True), or one still ran after ``timeout_s``
        (False: the caller does not touch rows the lake may write, and tries later)."""
        got = self._lock.acquire(timeout=timeout_s)
        try:
            yield got
        finally:
            if got:
                self._lock.release()

    def stop_revisiting(self, table: str, until: float) -> None:
        """Stop revisiting the written minutes of ``table`` that begin at or before ``until``
        (epoch seconds): the store deleted rows there to stay within its bound, and a revisit
        would write those minutes again without them (or remove their files). The lake keeps
        them as they were written. Call it inside :meth:`paused`. Minutes not written yet are
        left alone (a sender's clock ahead must not end the revisits of the minutes to come):
        they are written with the rows left, and a later call covers them."""
        if self._state is None:
            self._state = self._load()
        st = self._state[table]
        if st.through is None:  # nothing written: nothing to stop revisiting
            return
        first = min(math.floor(until / 60) + 1, st.through)
        if st.revisit_from is None or first > st.revisit_from:
            st.revisit_from = first
            st.recent = {m: w for m, w in st.recent.items() if m >= first}
            try:
                self._save(self._state)
            except OSError as exc:  # the lake's volume: the next tick saves it
                log.warning("parquet export: cannot save %s (%s)", self._state_path, exc)

    # -- the tick ------------------------------------------------------------------------------
    def export_closed_minutes(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """Write the closed minutes not yet written and the recent ones that changed; returns
        ``<table>/<YYYY-MM-DDTHH:MM>`` of each minute written."""
        with self._lock:
            return self._export_closed_minutes(con)

    def _export_closed_minutes(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        if self._state is None:
            self._state = self._load()
        state = self._state
        closed = math.floor((self.clock() - self.grace_s) / 60)  # minutes before it are closed
        written: list[str] = []
        for table in TABLES:
            st = state[table.name]
            if table.key is not None:  # first, with the revisits as they stand
                self._collect_late(con, table, st)
            changed = self._changed(con, table, st)
            room = self.max_minutes - len(changed)
            new = self._new(con, table, st, closed, room)
            for minute in (changed + new)[: self.max_minutes]:
                self._export_minute(con, table, st, minute)
                if st.through is None or minute >= st.through:
                    st.through = minute + 1
                self._save(state)
                stamp = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(minute * 60))
                written.append(f"{table.name}/{stamp}")
            if room > 0 and len(new) < room and (st.through is None or st.through < closed):
                st.through = closed  # every closed minute with rows is written
            for minute in sorted(st.late)[: self.max_minutes]:
                self._merge_minute(con, table, minute)
                st.late.discard(minute)
                self._save(state)
                stamp = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(minute * 60))
                written.append(f"{table.name}/{stamp}")
        self._save(state)
        if written:
            log.info("parquet export: %s", ", ".join(written))
        return written

    def _window(self, table: LakeTable) -> str:
        c = table.time_column
        return f"{c} >= to_timestamp(? * 60) AND {c} < to_timestamp(? * 60)"

    def _minute(self, table: LakeTable) -> str:
        return f"CAST(floor(epoch({table.time_column}) / 60) AS BIGINT)"

    def _new(
        self,
        con: duckdb.DuckDBPyConnection,
        table: LakeTable,
        st: _TableState,
        closed: int,
        limit: int,
    ) -> list[int]:
        """Closed minutes with rows that were never written, oldest first."""
        if limit <= 0:
            return []
        lo = st.through if st.through is not None else 0
        rows = con.execute(
            f"SELECT DISTINCT {self._minute(table)} AS m FROM {table.name} "
            f"WHERE {self._window(table)} ORDER BY m LIMIT ?",
            [lo, closed, limit],
        ).fetchall()
        return [int(m) for (m,) in rows]

    def _fingerprints(
        self, con: duckdb.DuckDBPyConnection, table: LakeTable, lo: int, hi: int
    ) -> dict[int, list[str]]:
        """Minute -> [rows, sum of the stamp in microseconds] over minutes ``[lo, hi)``."""
        rows = con.execute(
            f"SELECT {self._minute(table)} AS m, count(*), "
            f"CAST(coalesce(sum(epoch_us({table.stamp_column})), 0) AS VARCHAR) "
            f"FROM {table.name} WHERE {self._window(table)} GROUP BY m",
            [lo, hi],
        ).fetchall()
        return {int(m): [str(n), str(s)] for m, n, s in rows}

    def _changed(
        self, con: duckdb.DuckDBPyConnection, table: LakeTable, st: _TableState
    ) -> list[int]:
        """Written minutes still revisited whose rows changed since (oldest first); forgets
        the minutes past ``revisit_s``."""
        if table.stamp_column is None or st.through is None:
            return []
        lo = self._revisited_from(st, st.through)
        st.recent = {m: w for m, w in st.recent.items() if m >= lo}
        if lo >= st.through:
            return []
        now = self._fingerprints(con, table, lo, st.through)
        changed = {
            m for m, fp in now.items() if m not in st.recent or st.recent[m].fingerprint != fp
        }
        changed |= {m for m in st.recent if m not in now}  # every row gone
        return sorted(changed)

    def _revisited_from(self, st: _TableState, through: int) -> int:
        """The first written minute still revisited (``through``: none are)."""
        lo = through - self.revisit_minutes
        return lo if st.revisit_from is None else max(lo, st.revisit_from)

    def _collect_late(
        self, con: duckdb.DuckDBPyConnection, table: LakeTable, st: _TableState
    ) -> None:
        """Add to ``st.late`` the written minutes no longer revisited where rows changed (by
        ``table.stamp_column``) since the last tick looked."""
        stamp = f"epoch_us({table.stamp_column})"
        row = con.execute(f"SELECT max({stamp}) FROM {table.name}").fetchone()
        hi = None if row is None or row[0] is None else int(row[0])
        if hi is None:
            return
        if st.seen_to is None or st.through is None:  # nothing written yet: from now on
            st.seen_to = hi
            return
        if hi <= st.seen_to:
            return
        rows = con.execute(
            f"SELECT DISTINCT {self._minute(table)} FROM {table.name} "
            f"WHERE {stamp} > ? AND {stamp} <= ? AND {table.time_column} < to_timestamp(? * 60)",
            [st.seen_to, hi, self._revisited_from(st, st.through)],
        ).fetchall()
        st.late.update(int(m) for (m,) in rows)
        st.seen_to = hi
        if len(st.late) > MAX_LATE_MINUTES:
            dropped = sorted(st.late)[: len(st.late) - MAX_LATE_MINUTES]
            st.late.difference_update(dropped)
            log.warning(
                "parquet export: %d minutes of %s with late changes given up (more than %d "
                "wait), %s to %s: the lake keeps them as first written",
                len(dropped), table.name, MAX_LATE_MINUTES, minute_dir(dropped[0]),
                minute_dir(dropped[-1]),
            )  # fmt: skip

    # -- one minute ----------------------------------------------------------------------------
    def _export_minute(
        self, con: duckdb.DuckDBPyConnection, table: LakeTable, st: _TableState, minute: int
    ) -> None:
        window = [minute, minute + 1]
        # The fingerprint is taken before the copy: a change in between shows next tick.
        fingerprint = (
            self._fingerprints(con, table, *window).get(minute, ["0", "0"])
            if table.stamp_column
            else None
        )
        replicas = self._replicas(con, table, window)
        base = f"{self.out}/{table.name}/{minute_dir(minute)}"
        for replica in replicas:
            self._write(con, table, base, replica, window)
        before = st.recent.get(minute)
        if before is not None:
            for gone in set(before.replicas) - set(replicas):
                self._remove(con, table, base, gone)
        if fingerprint is not None:
            st.recent[minute] = _Written(fingerprint, replicas)

    def _merge_minute(self, con: duckdb.DuckDBPyConnection, table: LakeTable, minute: int) -> None:
        """Merge the store's rows of ``minute`` into the files written of it: a file's rows
        are kept but for those the store holds now (by ``table.key``), which replace them."""
        assert table.key is not None
        window = [minute, minute + 1]
        replicas = self._replicas(con, table, window)
        base = f"{self.out}/{table.name}/{minute_dir(minute)}"
        columns = ", ".join(f'"{c}"' for c in self._lake_columns(con, table))
        held = f"FROM {table.name} WHERE {self._window(table)} AND replica IS NOT DISTINCT FROM ?"
        for replica in replicas:
            dest = self._path(base, replica)
            params: list[Any] = [*window, replica]
            query = f"SELECT {table.columns()} {held}"
            if self._exists(con, dest):
                query = (
                    f"SELECT {columns} FROM (SELECT * FROM read_parquet({_sql_str(dest)}, "
                    f"hive_partitioning = false) WHERE {table.key} NOT IN "
                    f"(SELECT {table.key} {held}) UNION ALL BY NAME {query})"
                )
                params = [*params, *params]
            # read whole before the file is written over (a bucket's object is one upload)
            rows = con.sql(f"{query} ORDER BY {table.time_column}", params=params).to_arrow_table()
            con.register("slokit_lake_rows", rows)
            try:
                self._copy_to(con, "slokit_lake_rows", [], dest)
            finally:
                con.unregister("slokit_lake_rows")

    def _lake_columns(self, con: duckdb.DuckDBPyConnection, table: LakeTable) -> list[str]:
        """The columns of ``table``'s files, in the store's order."""
        left_out = {"replica", *table.local_only}
        rows = con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
            "AND schema_name = current_schema() AND table_name = ? ORDER BY column_index",
            [table.name],
        ).fetchall()
        return [c for (c,) in rows if c not in left_out]

    def _exists(self, con: duckdb.DuckDBPyConnection, dest: str) -> bool:
        if self.local:
            return Path(dest).exists()
        row = con.execute("SELECT count(*) FROM glob(?)", [dest]).fetchone()
        return row is not None and row[0] > 0

    def _copy_to(
        self, con: duckdb.DuckDBPyConnection, source: str, params: list[Any], dest: str
    ) -> None:
        """``COPY source TO dest`` as Parquet; a local file is written beside its place and
        renamed into it, so readers never see half a file."""
        target = dest
        if self.local:
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            target = str(Path(dest).with_name("." + Path(dest).name + ".tmp"))
        con.execute(
            f"COPY {source} TO {_sql_str(target)} (FORMAT parquet, COMPRESSION zstd)", params
        )
        if self.local:
            os.replace(target, dest)

    def _replicas(
        self, con: duckdb.DuckDBPyConnection, table: LakeTable, window: list[int]
    ) -> list[str | None]:
        """The replicas with rows of ``table`` in the minute ``window``."""
        rows = con.execute(
            f"SELECT DISTINCT replica FROM {table.name} WHERE {self._window(table)}", window
        ).fetchall()
        return [r for (r,) in rows]

    def _path(self, base: str, replica: str | None) -> str:
        return f"{base}/replica={partition_value(replica)}/{self._file}"

    def _write(
        self,
        con: duckdb.DuckDBPyConnection,
        table: LakeTable,
        base: str,
        replica: str | None,
        window: list[int],
    ) -> None:
        self._copy_to(
            con,
            f"(SELECT {table.columns()} FROM {table.name} "
            f"WHERE {self._window(table)} AND replica IS NOT DISTINCT FROM ? "
            f"ORDER BY {table.time_column})",
            [*window, replica],
            self._path(base, replica),
        )

    def _remove(
        self, con: duckdb.DuckDBPyConnection, table: LakeTable, base: str, replica: str | None
    ) -> None:
        dest = self._path(base, replica)
        if self.local:
            Path(dest).unlink(missing_ok=True)
        else:  # no delete through COPY: an empty file in its place
            con.execute(
                f"COPY (SELECT {table.columns()} FROM {table.name} WHERE false) "
                f"TO {_sql_str(dest)} (FORMAT parquet)"
            )
