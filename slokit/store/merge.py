"""Fragment merge: the SQL that folds a request's fragments into one ``requests`` row.

Every field takes the first non-NULL value in its source precedence, so the result does not
depend on the order fragments arrived in, and re-ingesting a fragment changes nothing.
Server-side facts trust vLLM first; the outcome (status, HTTP code, error) trusts the client
first, since only it saw what the caller got.
"""

from __future__ import annotations

from slokit.records import FRAGMENT_FIELDS

_DEFAULT_ORDER = ("vllm", "gateway", "client", "quality")
_OUTCOME_ORDER = ("client", "gateway", "vllm", "quality")
_OUTCOME_FIELDS = frozenset({"status", "http_status", "error_type"})

#: Columns of ``requests`` that come from fragments (everything but the key and bookkeeping).
MERGED_FIELDS: tuple[str, ...] = tuple(
    f for f in FRAGMENT_FIELDS if f not in ("request_id", "source", "fragment_id")
)


def _rank(order: tuple[str, ...]) -> str:
    whens = " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(order))
    return f"CASE source {whens} ELSE {len(order)} END"


def _pick(field: str) -> str:
    rank = "rank_outcome" if field in _OUTCOME_FIELDS else "rank_default"
    return f"arg_min({field}, {rank}) FILTER (WHERE {field} IS NOT NULL) AS {field}"


def sql_string_list(values: list[str]) -> str:
    """A constant SQL list of string literals. DuckDB answers ``col IN (<constants>)`` from the
    column's ART index, where a subquery or join would scan the whole table."""
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def merge_sql(ids_filter: str) -> str:
    """SQL selecting merged ``requests`` rows for the fragments matching ``ids_filter``
    (a predicate on ``request_id``, e.g. ``request_id IN ('a', 'b')``)."""
    picks = ",\n    ".join(_pick(f) for f in MERGED_FIELDS)
    cols = ", ".join(MERGED_FIELDS)
    return f"""
WITH frag AS (
    SELECT request_id, source, {cols},
           {_rank(_DEFAULT_ORDER)} AS rank_default,
           {_rank(_OUTCOME_ORDER)} AS rank_outcome
    FROM request_fragments
    WHERE {ids_filter}
), picked AS (
    SELECT request_id,
    {picks},
    list_sort(list_distinct(list(source))) AS sources
    FROM frag
    GROUP BY request_id
)
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
    now() AS updated_at
FROM picked
"""
