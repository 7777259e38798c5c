"""The store's write path: columnar appends, few statements per commit.

DuckDB's cost of an INSERT is mostly fixed (planning, and per column of the target table, not
per row), so a commit should touch as few tables with as few statements as it can:

- Fragments: the common case is a request seen for the first time. Its fragments are merged in
  memory (:func:`slokit.store.merge.merge_batch`) and a commit is two appends, one to
  ``request_fragments`` and one to ``requests``, optimistically: a request that already has a
  row (its fragments were stored before, or this is one of them sent again) violates
  ``requests``'s primary key, the transaction rolls back and the batch takes the checked path,
  as does a batch that names a fragment id twice (a resent span). A fragment is one per
  request id and fragment id (schema 10): the checked path keeps the first copy of each,
  reads the fragments stored for the batch's requests (an index lookup), appends the batch's
  new fragments, and replaces those requests' rows with the merge of all their fragments, in
  memory too. After a batch that met stored fragments the next :data:`CHECKED_BATCHES`
  batches go the checked way at once, so a re-ingest or a stream of late fragments does not
  pay twice.
- Engine samples: one row per scrape with its histograms as a list column, one statement.

Arrow tables reach DuckDB as replacement scans: DuckDB reads a local variable named
``slokit_*`` of the function that calls ``execute`` (registering a view instead costs as much as
the insert itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from slokit.errors import BadInput
from slokit.records import FRAGMENT_FIELDS, EngineSample, RequestFragment
from slokit.store import _trace_join
from slokit.store.merge import (
    FRAGMENT_ONLY_FIELDS,
    MERGED_FIELDS,
    merge_batch,
    merge_sql,
    sql_string_list,
)

if TYPE_CHECKING:
    from slokit.store.db import Store

TS = pa.timestamp("us", tz="UTC")

#: Request ids merged per statement: small enough that DuckDB looks them up in the ART indexes
#: (index_scan_max_count defaults to 2048) instead of scanning tables that grow without bound.
MERGE_CHUNK = 2000
#: One index lookup costs about as much as scanning this many rows (measured on DuckDB 2.0).
INDEX_LOOKUP_COST_ROWS = 700

FRAGMENT_TYPES: dict[str, pa.DataType] = {
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
        FRAGMENT_TYPES[_name] = TS
    elif _name.endswith("_s"):
        FRAGMENT_TYPES[_name] = pa.float64()
    else:
        FRAGMENT_TYPES.setdefault(_name, pa.string())

_KEYS = ("fragment_id", "request_id", "source")
#: ``request_fragments``'s columns in the table's order.
FRAGMENT_TABLE_COLUMNS = [*_KEYS, "ingested_at", *MERGED_FIELDS, *FRAGMENT_ONLY_FIELDS]
_SELECT_FRAGMENTS = f"SELECT {', '.join(FRAGMENT_FIELDS)}, ingested_at FROM request_fragments"
#: After a batch met stored fragments, this many batches take the checked path (a stream of
#: late fragments, a re-ingest) before the append path is tried again.
CHECKED_BATCHES = 16
_FIELD_GETTERS = [(name, attrgetter(name)) for name in FRAGMENT_FIELDS]
_TS_POSITIONS = [i for i, n in enumerate(FRAGMENT_FIELDS) if FRAGMENT_TYPES[n] == TS]
#: The fragment's fields as one struct (timestamps as epoch seconds, converted per column).
_FRAGMENT_STRUCT = pa.struct(
    [(n, pa.float64() if FRAGMENT_TYPES[n] == TS else FRAGMENT_TYPES[n]) for n in FRAGMENT_FIELDS]
)


@dataclass(frozen=True)
class AppendResult:
    received: int
    new: int
    requests_touched: int
    #: Fragments that can no longer join a request by trace id, by reason
    #: (:mod:`slokit.store._trace_join`).
    unjoined: dict[str, int] = field(default_factory=dict)


def run(con: duckdb.DuckDBPyConnection, sql: str, params: Any = None) -> list[Any]:
    """Execute a statement and consume its result (DuckDB 2 refuses further work on a
    connection whose last result is unfinished)."""
    return con.execute(sql, params).fetchall()


def ts_array(values: Sequence[float | None]) -> pa.Array:
    """Epoch seconds as microsecond timestamps (truncated toward zero, as ``int()``)."""
    return _seconds_to_ts(pa.array(values, pa.float64()))


def _seconds_to_ts(seconds: pa.Array) -> pa.Array:
    return pc.cast(pc.trunc(pc.multiply(seconds, 1_000_000.0)), pa.int64()).cast(TS)


def _array(name: str, values: Sequence[Any]) -> pa.Array:
    typ = FRAGMENT_TYPES[name]
    try:
        if typ == TS:
            return ts_array(values)
        if values and values[0] is None and values.count(None) == len(values):
            return pa.nulls(len(values), typ)
        return pa.array(values, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise BadInput(f"request fragments: field {name}: {exc}") from None


def fragments_table(fragments: Sequence[RequestFragment]) -> pa.Table:
    """RequestFragments as an Arrow table, one column per field (BadInput for a value of the
    wrong type, naming the field).

    The fragments (tuples of their fields) go to Arrow as one struct array, converted in C++
    (about 3x faster than a Python list per field); a value the conversion refuses takes the
    column-by-column path, which names the field."""
    try:
        columns = pa.array(fragments, _FRAGMENT_STRUCT).flatten()
        for i in _TS_POSITIONS:
            columns[i] = _seconds_to_ts(columns[i])
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return fragments_table_by_column(fragments)
    return pa.Table.from_arrays(columns, names=list(FRAGMENT_FIELDS))


def fragments_table_by_column(fragments: Sequence[RequestFragment]) -> pa.Table:
    """:func:`fragments_table` one field at a time: slower, and its BadInput names the field."""
    arrays = [_array(name, list(map(get, fragments))) for name, get in _FIELD_GETTERS]
    return pa.Table.from_arrays(arrays, names=list(FRAGMENT_FIELDS))


def _first_per_fragment(table: pa.Table, distinct_ids: int | None = None) -> pa.Table:
    """The first row of each fragment, a request id and fragment id (a batch may repeat a
    span, e.g. a retried export). ``distinct_ids``: the number of distinct fragment ids in
    ``table``, where the caller counted them already."""
    fids = table.column("fragment_id")
    if distinct_ids is None:
        distinct_ids = pc.count_distinct(fids).as_py()
    if distinct_ids == table.num_rows:
        return table
    first: dict[tuple[str, str], int] = {}
    pairs = zip(table.column("request_id").to_pylist(), fids.to_pylist(), strict=True)
    for i, pair in enumerate(pairs):
        first.setdefault(pair, i)
    if len(first) == table.num_rows:
        return table
    return table.take(sorted(first.values()))


def _without_stored(batch: pa.Table, stored: pa.Table) -> pa.Table:
    """``batch`` less the fragments ``stored`` holds (the same request id and fragment id)."""
    maybe = pc.indices_nonzero(pc.is_in(batch["fragment_id"], value_set=stored["fragment_id"]))
    if len(maybe) == 0:
        return batch
    held = set(
        zip(stored["request_id"].to_pylist(), stored["fragment_id"].to_pylist(), strict=True)
    )
    rids = batch["request_id"].take(maybe).to_pylist()
    fids = batch["fragment_id"].take(maybe).to_pylist()
    keep = [True] * batch.num_rows
    for i, rid, fid in zip(maybe.to_pylist(), rids, fids, strict=True):
        if (rid, fid) in held:
            keep[i] = False
    return batch.filter(pa.array(keep, pa.bool_()))


def append_fragment_table(store: Store, table: pa.Table) -> AppendResult:
    """Store fragments (the first copy of each request id and fragment id; one already stored
    is ignored) and merge their requests; see the module's docstring for the two paths."""
    n = table.num_rows
    if n == 0:
        return AppendResult(0, 0, 0)
    present = set(table.column_names)
    missing = [c for c in FRAGMENT_FIELDS if c not in present]
    if missing:
        raise BadInput(f"request fragments: missing columns {', '.join(missing)}")
    for key in _KEYS:
        if table.column(key).null_count:
            raise BadInput(f"request fragments: {table.column(key).null_count} without {key}")
    batch = table.select(list(FRAGMENT_FIELDS))
    try:
        with store._lock:
            return _append_joined(store, batch, n)
    except pa.ArrowInvalid as exc:  # a latency that is NaN or too big to add to a timestamp
        why = str(exc) if len(str(exc)) <= 120 else str(exc)[:120] + "..."
        raise BadInput(f"request fragments: a value out of range: {why}") from None


def _append_joined(store: Store, batch: pa.Table, n: int) -> AppendResult:
    """Append ``batch`` with the fragments that join it by trace id (see
    :mod:`slokit.store._trace_join`), then settle those still waiting."""
    batch, trace_only = _trace_join.split(batch)
    if trace_only is not None:
        trace_only = _first_per_fragment(trace_only)
    res = _trace_join.resolve(store, batch, trace_only)
    if res.joined is not None:
        batch = pa.concat_tables([batch, res.joined.cast(batch.schema)])
    touched = pc.count_distinct(batch.column("request_id")).as_py() if batch.num_rows else 0
    result = _append(store, batch, n, touched) if batch.num_rows else AppendResult(n, 0, 0)
    unjoined = _trace_join.settle(store, res, _insert_fragments)
    if res.waiting is not None:  # waiting fragments are stored, in the pending table
        result = AppendResult(n, result.new + res.waiting.num_rows, touched)
    return AppendResult(result.received, result.new, result.requests_touched, unjoined)


def _append(store: Store, batch: pa.Table, n: int, touched: int) -> AppendResult:
    with store._lock:
        rows = batch.num_rows
        distinct_ids = None
        if store._checked_batches_left == 0:
            distinct_ids = pc.count_distinct(batch.column("fragment_id")).as_py()
        if distinct_ids == rows:
            try:
                distinct = touched == rows
                return AppendResult(n, _append_all_new(store, batch, distinct), touched)
            except duckdb.ConstraintException:
                pass  # a request of the batch has a row already
        new, found = _append_checked(store, _first_per_fragment(batch, distinct_ids))
        left = CHECKED_BATCHES if found else store._checked_batches_left - 1
        store._checked_batches_left = max(0, left)
        return AppendResult(n, new, touched)


def _append_all_new(store: Store, batch: pa.Table, distinct: bool | None = None) -> int:
    """The fast path: every request of ``batch`` is new (``requests``'s primary key raises
    ConstraintException, and the transaction rolls back, if not), and no fragment id is in
    it twice (the caller knows). ``distinct``: whether each request has one fragment, if
    known."""
    merged = merge_batch(batch, distinct)
    now = store.clock()
    with store.transaction() as con:
        new = _insert_fragments(con, batch, now)
        _insert_requests(con, merged, _stamps(now, merged.num_rows))
    _count_new(store, new)
    return new


def _append_checked(store: Store, batch: pa.Table) -> tuple[int, bool]:
    """The general path: skip fragments already stored, append the rest, and merge each of
    their requests from all its fragments (those stored before and the batch's). Returns the
    fragments appended and whether anything of the batch was stored before. ``batch`` holds
    each fragment (request id and fragment id) once."""
    now = store.clock()
    with store.transaction() as con:
        rows = _rows_estimate(store, con)
        found = False
        ids = pc.unique(batch["request_id"])
        stored = _where_in(con, _SELECT_FRAGMENTS, "request_id", ids, rows) if len(ids) else None
        if stored is not None and stored.num_rows:
            found = True
            batch = _without_stored(batch, stored)
            # a request none of whose fragments is new keeps its row, updated_at included
            stored = stored.filter(pc.is_in(stored["request_id"], value_set=batch["request_id"]))
        if batch.num_rows == 0:
            return 0, found  # all stored already: nothing changes
        new = _insert_fragments(con, batch, now)
        first_seen = None
        if stored is not None and stored.num_rows:
            _delete_requests(con, pc.unique(stored["request_id"]), rows)
            first_seen = pa.TableGroupBy(
                stored.select(["request_id", "ingested_at"]), "request_id", use_threads=False
            ).aggregate([("ingested_at", "min")])
            stored = stored.drop_columns(["ingested_at"])
            batch = pa.concat_tables([stored.cast(batch.schema), batch])
        merged = merge_batch(batch)
        stamps = _stamps(now, merged.num_rows)
        if first_seen is not None:  # a request stored before keeps its first fragment's time
            at = pc.index_in(merged["request_id"], value_set=first_seen["request_id"])
            stamps = pc.coalesce(first_seen["ingested_at_min"].take(at).cast(TS), stamps)
        _insert_requests(con, merged, stamps)
    _count_new(store, new)
    return new, found


def _insert_fragments(
    con: duckdb.DuckDBPyConnection,
    batch: pa.Table,
    now: float,
    table: str = "request_fragments",
) -> int:
    """Append ``batch`` to ``table`` (``request_fragments`` or the trace join's pending
    table, which has the same columns)."""
    ingested = _stamps(now, batch.num_rows)
    rest = [*MERGED_FIELDS, *FRAGMENT_ONLY_FIELDS]
    slokit_rows = pa.table(  # noqa: F841 - DuckDB reads it by name
        [*batch.select(_KEYS).columns, ingested, *batch.select(rest).columns],
        names=FRAGMENT_TABLE_COLUMNS,
    )
    return int(con.execute(f"INSERT INTO {table} SELECT * FROM slokit_rows").fetchall()[0][0])


def _stamps(now: float, n: int) -> pa.Array:
    """``now`` as ``n`` timestamps, truncated as :func:`_insert_fragments` stamps
    ``ingested_at``."""
    return pa.array([int(now * 1_000_000)] * n, pa.int64()).cast(TS)


def _insert_requests(
    con: duckdb.DuckDBPyConnection, merged: pa.Table, first_ingested_at: pa.Array
) -> None:
    """Append ``merged`` (:func:`~slokit.store.merge.merge_batch`'s rows) with
    ``first_ingested_at`` per row; ``updated_at`` is the transaction's time, as in the merge
    SQL."""
    slokit_merged = merged.append_column("_first", first_ingested_at)  # noqa: F841 - by name
    con.execute(
        "INSERT INTO requests SELECT * EXCLUDE (_first), now(), _first FROM slokit_merged"
    ).fetchall()


def _rows_estimate(store: Store, con: duckdb.DuckDBPyConnection) -> int:
    if store._rows_estimate is None:
        store._rows_estimate = count_rows(con, "request_fragments")
    return store._rows_estimate


def _count_new(store: Store, new: int) -> None:
    if store._rows_estimate is not None:
        store._rows_estimate += new


def count_rows(con: duckdb.DuckDBPyConnection, table: str) -> int:
    return int(run(con, f"SELECT count(*) FROM {table}")[0][0])


def _where_in(
    con: duckdb.DuckDBPyConnection, select: str, column: str, values: Any, rows: int
) -> pa.Table:
    """``select`` (from one table) for the rows whose ``column`` (a key with an ART index) is
    one of ``values``, as Arrow. Two plans with the same result: a few values against a big
    table (``rows``) are looked up in the index with constant IN lists (DuckDB answers a
    subquery or a join by scanning); many, or a small table, are joined in one scan."""
    if len(values) * INDEX_LOOKUP_COST_ROWS < rows:
        vals = values.to_pylist()
        parts = [
            con.sql(
                f"{select} WHERE {column} IN ({sql_string_list(vals[i : i + MERGE_CHUNK])})"
            ).to_arrow_table()
            for i in range(0, len(vals), MERGE_CHUNK)
        ]
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    slokit_probe = pa.table({"v": values})  # noqa: F841 - DuckDB reads it by name
    return con.sql(f"{select} WHERE {column} IN (SELECT v FROM slokit_probe)").to_arrow_table()


def _delete_requests(con: duckdb.DuckDBPyConnection, ids: Any, rows: int) -> None:
    """Delete the ``requests`` rows of ``ids`` (the same two plans as :func:`_where_in`)."""
    if len(ids) * INDEX_LOOKUP_COST_ROWS < rows:
        vals = ids.to_pylist()
        for i in range(0, len(vals), MERGE_CHUNK):
            consts = sql_string_list(vals[i : i + MERGE_CHUNK])
            run(con, f"DELETE FROM requests WHERE request_id IN ({consts})")
        return
    slokit_probe = pa.table({"v": ids})  # noqa: F841 - DuckDB reads it by name
    sql = "DELETE FROM requests WHERE request_id IN (SELECT v FROM slokit_probe)"
    con.execute(sql).fetchall()


def merge_existing(store: Store, con: duckdb.DuckDBPyConnection, ids: pa.Array) -> None:
    """Re-merge the ``requests`` rows of ``ids`` from all their stored fragments with the merge
    SQL (what the append path computes in memory)."""
    _delete_requests(con, ids, _rows_estimate(store, con))
    select = merge_sql("request_id IN (SELECT v FROM slokit_probe)")
    slokit_probe = pa.table({"v": ids})  # noqa: F841 - DuckDB reads it by name
    con.execute("INSERT INTO requests " + select).fetchall()


# -- rows of the other tables -------------------------------------------------------------

ENGINE_SCALARS = (
    "running", "waiting", "kv_usage_ratio", "preemptions_total", "prompt_tokens_total",
    "generation_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
    "request_success_total", "spec_decode_drafts_total",
    "spec_decode_draft_tokens_total", "spec_decode_accepted_tokens_total",
    "num_gpu_blocks", "block_size",
)  # fmt: skip

#: EngineSample dicts stored as ``MAP(VARCHAR, DOUBLE)`` columns of the same name.
ENGINE_MAPS = ("request_success_by_reason", "waiting_by_reason", "prompt_tokens_by_source")

HISTOGRAM_TYPE = pa.list_(
    pa.struct(
        [
            ("metric", pa.string()),
            ("upper_bounds", pa.list_(pa.float64())),
            ("cumulative_counts", pa.list_(pa.float64())),
            ("sum", pa.float64()),
            ("count", pa.float64()),
        ]
    )
)


def _histograms(sample: EngineSample) -> list[dict[str, Any]]:
    return [
        {
            "metric": h.metric,
            "upper_bounds": h.upper_bounds,
            "cumulative_counts": h.cumulative_counts,
            "sum": h.sum,
            "count": h.count,
        }
        for h in sample.histograms.values()
    ]


def engine_table(samples: Sequence[EngineSample]) -> pa.Table:
    """Engine samples as ``engine_samples`` rows, histograms in the row's list column."""
    cols: dict[str, pa.Array] = {
        "ts": ts_array([s.ts for s in samples]),
        "replica": pa.array([s.replica for s in samples], pa.string()),
        "model": pa.array([s.model for s in samples], pa.string()),
        "engine": pa.array([s.engine for s in samples], pa.string()),
    }
    for name in ENGINE_SCALARS:
        cols[name] = pa.array([getattr(s, name) for s in samples], pa.float64())
    for name in ENGINE_MAPS:
        cols[name] = pa.array(
            [list(getattr(s, name).items()) for s in samples], pa.map_(pa.string(), pa.float64())
        )
    cols["histograms"] = pa.array([_histograms(s) for s in samples], HISTOGRAM_TYPE)
    return pa.table(cols)


#: Up to this many engine samples go in as statement parameters: a scrape's few rows cost
#: less so than through an Arrow scan; more (a file of history) go through Arrow.
ENGINE_PARAMS_MAX = 8
_ENGINE_COLUMNS = ("ts", "replica", "model", "engine", *ENGINE_SCALARS)
# ts as whole microseconds, truncated as ts_array does (to_timestamp(double) would round)
_ENGINE_ROW = (
    "(to_timestamp(0) + to_microseconds(?), "
    + ", ".join("?" for _ in _ENGINE_COLUMNS[1:])
    + ", ?" * (len(ENGINE_MAPS) + 1)
    + ")"
)
_ENGINE_INSERT = (
    f"INSERT INTO engine_samples ({', '.join(_ENGINE_COLUMNS)}, {', '.join(ENGINE_MAPS)}, "
    "histograms) VALUES "
)


def append_engine_samples(store: Store, samples: Sequence[EngineSample]) -> int:
    """One ``engine_samples`` row per sample, its histograms in the row: one statement."""
    if len(samples) > ENGINE_PARAMS_MAX:
        return append_table(store, "engine_samples", engine_table(samples))
    params: list[Any] = []
    for s in samples:
        params.append(int(s.ts * 1_000_000))
        params += [getattr(s, c) for c in _ENGINE_COLUMNS[1:]]
        params += [getattr(s, name) for name in ENGINE_MAPS]
        params.append(_histograms(s))
    sql = _ENGINE_INSERT + ", ".join([_ENGINE_ROW] * len(samples))
    with store.transaction() as con:
        run(con, sql, params)
    return len(samples)


def append_table(store: Store, table: str, slokit_rows: pa.Table) -> int:
    """Append an Arrow table's rows (columns named as the table's) in one statement."""
    if slokit_rows.num_rows == 0:
        return 0
    with store.transaction() as con:
        insert_table(con, table, slokit_rows)
    return int(slokit_rows.num_rows)


def insert_table(con: duckdb.DuckDBPyConnection, table: str, slokit_rows: pa.Table) -> None:
    """Insert an Arrow table's rows (columns named as the table's), in the caller's transaction."""
    names = ", ".join(slokit_rows.column_names)
    con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM slokit_rows").fetchall()
