"""Fragment merge: how a request's fragments fold into one ``requests`` row.

Every field takes the first non-NULL value in its source precedence, ties between fragments of
one source broken by ``fragment_id``, so the result depends only on the set of fragments: not
on the order they arrived in, and re-ingesting a fragment changes nothing. Server-side facts
trust vLLM first; the outcome (status, HTTP code, error) trusts the client first, since only it
saw what the caller got.

That holds for a client fragment ``incomplete`` too (a load test cut the request at its end):
the merged status stays ``incomplete`` even when vLLM's span of the same request shows it
finished (an E2E, status ok). The server may well have served it, but the caller stopped
listening before the answer arrived, so no one measured what a user would have got; the
request is counted apart and judged neither good nor bad. vLLM's own latencies stay in the
row (vLLM first), for ``explain``.

The rule has two implementations that give identical rows (``tests/store``): :func:`merge_sql`
merges in SQL from the stored fragments (the reference, and ``Store._merge``);
:func:`merge_batch` merges fragments in memory (Arrow), as the write path does. Each picks the
facts, then derives what follows from them (timestamps from latencies, TPOT, an ok status).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slokit.records import FRAGMENT_FIELDS

_DEFAULT_ORDER = ("vllm", "gateway", "client", "quality")
_OUTCOME_ORDER = ("client", "gateway", "vllm", "quality")
_OUTCOME_FIELDS = frozenset({"status", "http_status", "error_type"})

#: Fragment facts kept in ``request_fragments`` only (read per fragment, never merged).
FRAGMENT_ONLY_FIELDS: tuple[str, ...] = ("gateway_routing_s",)
#: Columns of ``requests`` that come from fragments (everything but the key and bookkeeping).
MERGED_FIELDS: tuple[str, ...] = tuple(
    f
    for f in FRAGMENT_FIELDS
    if f not in ("request_id", "source", "fragment_id", *FRAGMENT_ONLY_FIELDS)
)
_DEFAULT_FIELDS = tuple(f for f in MERGED_FIELDS if f not in _OUTCOME_FIELDS)
_OUTCOME_FIELDS_ORDERED = tuple(f for f in MERGED_FIELDS if f in _OUTCOME_FIELDS)


def _rank(order: tuple[str, ...]) -> str:
    whens = " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(order))
    return f"CASE source {whens} ELSE {len(order)} END"


def _pick(field: str) -> str:
    rank = "rank_outcome" if field in _OUTCOME_FIELDS else "rank_default"
    return (
        f"arg_min({field}, {{'r': {rank}, 'f': fragment_id}}) "
        f"FILTER (WHERE {field} IS NOT NULL) AS {field}"
    )


def sql_string_list(values: list[str]) -> str:
    """A constant SQL list of string literals. DuckDB answers ``col IN (<constants>)`` from the
    column's ART index, where a subquery or join would scan the whole table."""
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def derive_sql(relation: str) -> str:
    """SQL selecting ``requests`` rows (in the table's column order) from ``relation``, which
    holds one row per request of picked facts: ``request_id``, the :data:`MERGED_FIELDS`,
    ``sources`` (the sorted distinct sources) and ``first_ingested_at`` (the earliest
    fragment's ``ingested_at``). Timestamps, TPOT and an ok status that the
    facts imply are filled in here (:func:`derive_arrow` is the same in memory)."""
    return f"""
SELECT
    request_id, trace_id, replica, model, tenant, slo_class, task_id,
    arrival_ts,
    coalesce(first_token_ts, arrival_ts + to_microseconds(CAST(ttft_s * 1e6 AS BIGINT))) AS first_token_ts,
    coalesce(finish_ts, arrival_ts + to_microseconds(CAST(e2e_s * 1e6 AS BIGINT))) AS finish_ts,
    client_ttft_s, client_e2e_s, ttft_s, queue_s, prefill_s, decode_s, inference_s, e2e_s,
    gateway_e2e_s,
    coalesce(tpot_s, CASE WHEN output_tokens > 1 AND e2e_s IS NOT NULL AND ttft_s IS NOT NULL
                          THEN (e2e_s - ttft_s) / (output_tokens - 1) END) AS tpot_s,
    itl_p95_s, prompt_tokens, output_tokens, cached_tokens, max_tokens, preemptions,
    finish_reason,
    coalesce(status, CASE WHEN list_contains(sources, 'vllm') THEN 'ok' END) AS status,
    http_status, error_type, quality_pass,
    sources,
    now() AS updated_at,
    first_ingested_at
FROM {relation}
"""


def merge_sql(ids_filter: str) -> str:
    """SQL selecting merged ``requests`` rows for the fragments matching ``ids_filter``
    (a predicate on ``request_id``, e.g. ``request_id IN ('a', 'b')``)."""
    picks = ",\n    ".join(_pick(f) for f in MERGED_FIELDS)
    cols = ", ".join(MERGED_FIELDS)
    return f"""
WITH frag AS (
    SELECT request_id, source, fragment_id, ingested_at, {cols},
           {_rank(_DEFAULT_ORDER)} AS rank_default,
           {_rank(_OUTCOME_ORDER)} AS rank_outcome
    FROM request_fragments
    WHERE {ids_filter}
), picked AS (
    SELECT request_id,
    {picks},
    list_sort(list_distinct(list(source))) AS sources,
    min(ingested_at) AS first_ingested_at
    FROM frag
    GROUP BY request_id
)
{derive_sql("picked")}
"""


def _rank_array(source: pa.ChunkedArray, order: tuple[str, ...]) -> pa.Array:
    ranks = pc.index_in(source, value_set=pa.array(order, pa.string()))
    return pc.fill_null(ranks, len(order))


def pick_fragments(batch: pa.Table, distinct: bool | None = None) -> pa.Table:
    """The picked facts of each request in ``batch`` (fragments with distinct fragment ids,
    columns named as RequestFragment), one row per request: ``request_id``, the
    :data:`MERGED_FIELDS` and ``sources``, the relation :func:`derive_sql` reads.

    The same rule as :func:`merge_sql`, computed in memory: a request with one fragment
    keeps its values; several fragments of one request are ordered by (source rank,
    fragment_id) and each field takes the first non-null value. ``distinct``: whether every
    request of ``batch`` has one fragment there, if the caller knows (counted if None)."""
    n = batch.num_rows
    source = batch.column("source")
    if distinct is None:
        distinct = pc.count_distinct(batch.column("request_id")).as_py() == n
    if distinct:
        offsets = pa.array(range(n + 1), pa.int32())
        sources = pa.ListArray.from_arrays(offsets, source.combine_chunks())
        same = [batch.column(f) for f in ("request_id", *MERGED_FIELDS)]
        return pa.table([*same, sources], names=["request_id", *MERGED_FIELDS, "sources"])
    keyed = batch.select(["request_id", "fragment_id", "source", *MERGED_FIELDS])
    default = _first_per_request(keyed, _rank_array(source, _DEFAULT_ORDER), _DEFAULT_FIELDS)
    outcome = _first_per_request(
        keyed, _rank_array(source, _OUTCOME_ORDER), _OUTCOME_FIELDS_ORDERED
    )
    source_sets = default.column("source_distinct").to_pylist()
    cols: dict[str, Any] = {"request_id": default.column("request_id")}
    for f in MERGED_FIELDS:
        picked = outcome if f in _OUTCOME_FIELDS else default
        cols[f] = picked.column(f"{f}_first")
    cols["sources"] = pa.array([sorted(s) for s in source_sets], pa.list_(pa.string()))
    return pa.table(cols)


def _first_per_request(keyed: pa.Table, rank: pa.Array, fields: tuple[str, ...]) -> pa.Table:
    """Per request_id (in sorted order), the first non-null value of each field in
    (rank, fragment_id) order, and the distinct sources."""
    ordered = keyed.append_column("_rank", rank).sort_by(
        [("request_id", "ascending"), ("_rank", "ascending"), ("fragment_id", "ascending")]
    )
    grouped = pa.TableGroupBy(ordered, "request_id", use_threads=False).aggregate(
        [(f, "first") for f in fields] + [("source", "distinct")]
    )
    return grouped.sort_by("request_id")


def merge_batch(batch: pa.Table, distinct: bool | None = None) -> pa.Table:
    """The ``requests`` rows of the requests in ``batch`` merged from its fragments alone
    (:func:`merge_sql`'s result for requests with no other fragments), in the table's column
    order, without the bookkeeping the write path adds (``updated_at``, ``first_ingested_at``).
    ``distinct``: as :func:`pick_fragments`."""
    return derive_arrow(pick_fragments(batch, distinct))


def _micros(seconds: pa.ChunkedArray) -> pa.ChunkedArray:
    # CAST(x * 1e6 AS BIGINT) in DuckDB rounds half away from zero.
    scaled = pc.round(pc.multiply(seconds, 1e6), round_mode="half_towards_infinity")
    return pc.cast(pc.cast(scaled, pa.int64()), pa.duration("us"))


def derive_arrow(picked: pa.Table) -> pa.Table:
    """:func:`derive_sql` computed in Arrow (every column but the bookkeeping ones)."""
    col = picked.column
    arrival = col("arrival_ts")
    derived = {
        "first_token_ts": pc.coalesce(
            col("first_token_ts"), pc.add_checked(arrival, _micros(col("ttft_s")))
        ),
        "finish_ts": pc.coalesce(col("finish_ts"), pc.add_checked(arrival, _micros(col("e2e_s")))),
    }
    out_tokens = col("output_tokens")
    implied_tpot = pc.if_else(
        pc.greater(out_tokens, 1),
        pc.divide(
            pc.subtract(col("e2e_s"), col("ttft_s")),
            pc.cast(pc.subtract(out_tokens, 1), pa.float64()),
        ),
        pa.scalar(None, pa.float64()),
    )
    derived["tpot_s"] = pc.coalesce(col("tpot_s"), implied_tpot)
    from_vllm = _contains(col("sources"), "vllm")
    derived["status"] = pc.coalesce(
        col("status"), pc.if_else(from_vllm, pa.scalar("ok"), pa.scalar(None, pa.string()))
    )
    names = ["request_id", *MERGED_FIELDS, "sources"]
    return pa.table([derived.get(n, col(n)) for n in names], names=names)


def _contains(lists: pa.ChunkedArray, value: str) -> pa.Array:
    """Per row of a list<string> column: does the list hold ``value``."""
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    rows = pc.list_parent_indices(lists).filter(pc.equal(pc.list_flatten(lists), value))
    mask = np.zeros(len(lists), dtype=bool)
    mask[rows.to_numpy()] = True
    return pa.array(mask)
