"""Trace-id joins: fragments that name no request id join the request of their trace.

A gateway span that carries no request id (the llm-d router's spans, a proxy configured
without ``x-request-id``) still shares the W3C trace id with vLLM's ``llm_request`` span of
the same request. The decoder hands such a span over as a fragment whose ``request_id`` is
:data:`TRACE_ONLY_ID` (empty). On each append:

- :func:`resolve` finds, for every such fragment and for every fragment waiting in
  ``pending_trace_fragments`` whose trace the batch names, the request of its trace: the
  fragment of that trace with a request id, vLLM's first (then gateway, client, quality; ties
  by request id), in the batch or stored. Those join the batch under that request id, so the
  merge (:mod:`slokit.store.merge`) folds them in like any other fragment: idempotent and
  independent of arrival order.
- :func:`settle`, after the batch is committed, stores the fragments still without a partner
  in ``pending_trace_fragments``, removes the ones that joined, and drops those waiting more
  than :data:`PENDING_MAX_AGE_S` (``expired``) or beyond :data:`PENDING_MAX_ROWS`, oldest
  first (``overflow``). A fragment without a trace id can never join (``no_trace_id``).
  Dropped fragments are counted by reason in ``unjoined_spans`` and returned, for the
  sidecar's ``slokit_spans_unjoined_total``.

Settling after the commit keeps a crash harmless: a fragment that joined but is still
pending is found again by its trace and skipped as already stored, and is removed without
being counted.

The index on ``request_fragments.trace_id`` that the lookups use is built by
:func:`resolve` the first time a store meets a fragment that joins by trace (schema 9): a
store that never does (vLLM spans, clients and gateways that name the request id) does not
maintain it, which is about a tenth of what storing a fragment costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary, WeakSet

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from slokit.records import FRAGMENT_FIELDS, SOURCE_PRECEDENCE
from slokit.store.merge import sql_string_list

if TYPE_CHECKING:
    from slokit.store.db import Store

#: The ``request_id`` of a fragment that joins its request by trace id.
TRACE_ONLY_ID = ""
#: How long a fragment waits for a partner of its trace.
PENDING_MAX_AGE_S = 600.0
#: How many fragments wait at most (the oldest are dropped beyond).
PENDING_MAX_ROWS = 100_000
#: ``unjoined_spans`` reasons (the ``reason`` label of ``slokit_spans_unjoined_total``).
UNJOINED_REASONS = ("expired", "overflow", "no_trace_id")

_PENDING = "pending_trace_fragments"
_CHUNK = 2000
#: How a table of fragments is written: (connection, fragments, now, table) -> rows.
InsertFragments = Callable[[duckdb.DuckDBPyConnection, pa.Table, float, str], int]
_SELECT = ", ".join(FRAGMENT_FIELDS)
#: Rows waiting in each store (None until counted): no query while nothing waits.
_pending_rows: WeakKeyDictionary[Store, int] = WeakKeyDictionary()
#: The index of ``request_fragments.trace_id`` (schema 9: built on first use).
TRACE_INDEX = "request_fragments_trace_id"
#: Stores whose trace-id index is known to exist.
_indexed: WeakSet[Store] = WeakSet()


def ensure_trace_index(store: Store) -> None:
    """Build ``request_fragments``'s trace-id index if the file has none yet (once: DuckDB
    builds it from the stored rows in one pass, then keeps it up to date)."""
    if store in _indexed:
        return
    con = store.con
    sql = "SELECT count(*) FROM duckdb_indexes() WHERE index_name = ?"
    if not con.execute(sql, [TRACE_INDEX]).fetchall()[0][0]:
        con.execute(f"CREATE INDEX {TRACE_INDEX} ON request_fragments (trace_id)").fetchall()
    _indexed.add(store)


@dataclass
class Resolution:
    """What :func:`resolve` found for one batch."""

    #: Fragments (from the batch or pending) that now carry their trace's request id.
    joined: pa.Table | None = None
    #: Fragment ids of pending fragments among ``joined``.
    consumed: list[str] = field(default_factory=list)
    #: Trace-only fragments of the batch without a partner yet.
    waiting: pa.Table | None = None
    #: Trace-only fragments without a trace id: they can never join.
    no_trace: int = 0


def split(batch: pa.Table) -> tuple[pa.Table, pa.Table | None]:
    """The batch's fragments with a request id, and those that join by trace (None: none)."""
    trace_only = pc.equal(batch["request_id"], TRACE_ONLY_ID)
    if not pc.any(trace_only).as_py():
        return batch, None
    return batch.filter(pc.invert(trace_only)), batch.filter(trace_only)


def _pending_count(store: Store, con: duckdb.DuckDBPyConnection) -> int:
    n = _pending_rows.get(store)
    if n is None:
        n = int(con.execute(f"SELECT count(*) FROM {_PENDING}").fetchall()[0][0])
        _pending_rows[store] = n
    return n


def resolve(store: Store, batch: pa.Table, trace_only: pa.Table | None) -> Resolution:
    """Give trace-only fragments (of the batch, and pending ones of the batch's traces) the
    request id of their trace where a fragment of it is known. Reads only."""
    con = store.con
    out = Resolution()
    if trace_only is not None:
        has_trace = pc.fill_null(pc.not_equal(trace_only["trace_id"], ""), False)
        out.no_trace = trace_only.num_rows - int(pc.sum(has_trace).as_py() or 0)
        trace_only = trace_only.filter(has_trace)
        if trace_only.num_rows == 0:
            trace_only = None
    waiting_before = _pending_count(store, con)
    if trace_only is None and waiting_before == 0:
        return out
    traces = set(pc.unique(batch["trace_id"].drop_null()).to_pylist())
    candidates: list[pa.Table] = []
    if trace_only is not None:
        traces |= set(trace_only["trace_id"].to_pylist())
        candidates.append(trace_only)
    traces.discard("")
    if not traces:
        out.waiting = trace_only
        return out
    consts = sql_string_list(sorted(traces))
    pending_ids: set[str] = set()
    if waiting_before:
        pending = con.sql(f"SELECT {_SELECT} FROM {_PENDING} WHERE trace_id IN ({consts})")
        stored_pending = pending.to_arrow_table()
        if stored_pending.num_rows:
            candidates.append(stored_pending.cast(batch.schema))
            pending_ids = set(stored_pending["fragment_id"].to_pylist())
    if not candidates:
        return out
    pool = pa.concat_tables(candidates)
    ensure_trace_index(store)
    partners = _partners(con, batch, set(pool["trace_id"].to_pylist()))
    ids = [partners.get(t) for t in pool["trace_id"].to_pylist()]
    found = pc.is_valid(pa.array(ids, pa.string()))
    joined = pool.filter(found)
    if joined.num_rows:
        rid = pa.array([i for i in ids if i is not None], pa.string())
        at = joined.schema.get_field_index("request_id")
        out.joined = joined.set_column(at, "request_id", rid)
        out.consumed = sorted(set(joined["fragment_id"].to_pylist()) & pending_ids)
    if trace_only is not None:
        mine = pc.is_in(pool["fragment_id"], value_set=trace_only["fragment_id"])
        left = pool.filter(pc.and_(mine, pc.invert(found)))
        out.waiting = left if left.num_rows else None
    return out


def _partners(con: duckdb.DuckDBPyConnection, batch: pa.Table, traces: set[str]) -> dict[str, str]:
    """trace id -> the request id of its trace: the first (source precedence, request id)
    among the batch's fragments with a request id and the stored ones."""
    rank = {s: i for i, s in enumerate(SOURCE_PRECEDENCE)}
    best: dict[str, tuple[int, str]] = {}

    def offer(trace: str | None, source: str, request_id: str) -> None:
        if not trace or trace not in traces or not request_id:
            return
        key = (rank.get(source, len(rank)), request_id)
        if trace not in best or key < best[trace]:
            best[trace] = key

    cols = batch.select(["trace_id", "source", "request_id"]).to_pydict()
    for t, s, r in zip(cols["trace_id"], cols["source"], cols["request_id"], strict=True):
        offer(t, s, r)
    if traces:
        rows = con.execute(
            "SELECT trace_id, source, request_id FROM request_fragments "
            f"WHERE trace_id IN ({sql_string_list(sorted(traces))})"
        ).fetchall()
        for t, s, r in rows:
            offer(t, s, r)
    return {t: key[1] for t, key in best.items()}


def _stored(
    con: duckdb.DuckDBPyConnection,
    fids: list[str],
    traces: list[str],
    table: str = "request_fragments",
) -> set[str]:
    """Which of ``fids`` (fragments of ``traces``) ``table`` holds, under any request id: the
    rows of those traces (through ``request_fragments``'s trace-id index: fragment ids have
    none, and DuckDB uses one index per scan) whose fragment id is one of ``fids``."""
    wanted, found = set(fids), set[str]()
    distinct = sorted(set(traces))
    for i in range(0, len(distinct), _CHUNK):
        consts = sql_string_list(distinct[i : i + _CHUNK])
        sql = f"SELECT fragment_id FROM {table} WHERE trace_id IN ({consts})"
        found.update(r[0] for r in con.execute(sql).fetchall() if r[0] in wanted)
    return found


def settle(store: Store, res: Resolution, insert: InsertFragments) -> dict[str, int]:
    """After the batch's commit: store the fragments still waiting, remove the joined ones,
    drop what waited too long or too many; returns the dropped fragments by reason."""
    con = store.con
    counts = {"no_trace_id": res.no_trace} if res.no_trace else {}
    if res.waiting is None and not res.consumed and not counts and not _pending_count(store, con):
        return {}
    now = store.clock()
    if res.waiting is not None or _pending_count(store, con):
        ensure_trace_index(store)  # the lookups below go by trace id
    with store.transaction() as con:
        if res.waiting is not None:
            fids = res.waiting["fragment_id"].to_pylist()
            traces = res.waiting["trace_id"].to_pylist()
            known = _stored(con, fids, traces) | _stored(con, fids, traces, _PENDING)
            fresh = res.waiting.filter(
                pc.invert(
                    pc.is_in(
                        res.waiting["fragment_id"], value_set=pa.array(sorted(known), pa.string())
                    )
                )
            )
            if fresh.num_rows:
                insert(con, fresh, now, _PENDING)
        if res.consumed:
            con.execute(
                f"DELETE FROM {_PENDING} WHERE fragment_id IN ({sql_string_list(res.consumed)})"
            ).fetchall()
        cutoff = [now - PENDING_MAX_AGE_S]
        old = "ingested_at < to_timestamp(?)"
        aged = con.execute(
            f"SELECT fragment_id, trace_id FROM {_PENDING} WHERE {old}", cutoff
        ).fetchall()
        if aged:
            con.execute(f"DELETE FROM {_PENDING} WHERE {old}", cutoff).fetchall()
            # Joined before a crash and left over here: not unjoined.
            joined = _stored(con, [r[0] for r in aged], [r[1] for r in aged])
            if len(aged) > len(joined):
                counts["expired"] = len(aged) - len(joined)
        rows = int(con.execute(f"SELECT count(*) FROM {_PENDING}").fetchall()[0][0])
        if rows > PENDING_MAX_ROWS:
            over = rows - PENDING_MAX_ROWS
            con.execute(
                f"DELETE FROM {_PENDING} WHERE fragment_id IN (SELECT fragment_id FROM "
                f"{_PENDING} ORDER BY ingested_at, fragment_id LIMIT {over})"
            ).fetchall()
            counts["overflow"] = over
            rows = PENDING_MAX_ROWS
        for reason, n in sorted(counts.items()):
            con.execute(
                "INSERT INTO unjoined_spans VALUES (to_timestamp(?), ?, ?)", [now, reason, n]
            ).fetchall()
    _pending_rows[store] = rows
    return counts
