"""The window frames diagnosis reads: requests, completions, engine and GPU samples bucketed
by ``(replica, bucket)`` in one set-wise query each, and exact request summaries.

Values outside the plausible range of :mod:`slokit.sources.validate` (NaN, infinities, a
counter past 2**53, a negative latency: stored before validation existed, or by another
writer) are read as NULL, a missing fact, so no rule computes with them.

Rows with no replica (client-only records) are grouped under the replica ``""``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import duckdb

if TYPE_CHECKING:  # DuckDB builds the frames; the sidecar's steady state never imports pandas
    import pandas as pd

from slokit.records import ERROR_STATUSES
from slokit.sources.validate import MAX_COUNT, MAX_DURATION_S, MAX_RATIO, MAX_TOKENS
from slokit.store.migrations import LOCAL_REQUEST_COLUMNS

_COUNTERS: tuple[tuple[str, str], ...] = (
    ("preemptions_total", "preemptions"),
    ("prompt_tokens_total", "prompt_tokens"),
    ("generation_tokens_total", "generation_tokens"),
    ("prefix_cache_queries_total", "prefix_queries"),
    ("prefix_cache_hits_total", "prefix_hits"),
    ("request_success_total", "successes"),
    ("spec_decode_drafts_total", "spec_drafts"),
    ("spec_decode_draft_tokens_total", "spec_draft_tokens"),
    ("spec_decode_accepted_tokens_total", "spec_accepted"),
    # prompt_tokens_by_source's counters (derived in ENGINE_SAMPLES): tokens prefilled,
    # served by the local prefix cache, and received over a KV connector.
    ("prompt_local_compute_total", "prompt_computed"),
    ("prompt_local_cache_hit_total", "prompt_cached"),
    ("prompt_external_kv_transfer_total", "prompt_external"),
)

#: ``engine_samples`` with the map columns' known keys as columns of their own (a key an
#: engine does not expose reads as NULL): vLLM's waiting reasons and prompt token sources.
ENGINE_SAMPLES = (
    "(SELECT *, waiting_by_reason['capacity'] AS waiting_capacity, "
    "waiting_by_reason['deferred'] AS waiting_deferred, "
    "prompt_tokens_by_source['local_compute'] AS prompt_local_compute_total, "
    "prompt_tokens_by_source['local_cache_hit'] AS prompt_local_cache_hit_total, "
    "prompt_tokens_by_source['external_kv_transfer'] AS prompt_external_kv_transfer_total "
    "FROM engine_samples)"
)


def _sane(column: str, lo: float, hi: float) -> str:
    """SQL: ``column`` where it lies in [lo, hi], else NULL (NaN and infinities included)."""
    return f"CASE WHEN {column} BETWEEN {lo!r} AND {hi!r} THEN {column} END"


_COUNT = (0.0, MAX_COUNT)
#: ``requests`` with implausible values read as NULL (DuckDB's ``* REPLACE``).
REQUESTS = (
    "(SELECT * REPLACE ("
    + ", ".join(
        f"{_sane(c, 0.0, MAX_DURATION_S)} AS {c}"
        for c in ("ttft_s", "client_ttft_s", "tpot_s", "e2e_s", "client_e2e_s", "queue_s",
                  "prefill_s", "decode_s", "gateway_e2e_s")
    )
    + ", "
    + ", ".join(
        f"{_sane(c, 0, MAX_TOKENS)} AS {c}" for c in ("prompt_tokens", "output_tokens")
    )
    # the local store's bookkeeping left out, so that every reader's requests have the same
    # columns (a lake has none of it)
    + ") FROM (SELECT COLUMNS(lambda c: c NOT IN ("
    + ", ".join(f"'{c}'" for c in LOCAL_REQUEST_COLUMNS)
    + ")) FROM requests))"
)  # fmt: skip
#: ``gpu_samples`` likewise.
GPU_SAMPLES = (
    "(SELECT * REPLACE ("
    + ", ".join(
        f"{_sane(c, *r)} AS {c}"
        for c, r in (("util_ratio", (0.0, MAX_RATIO)), ("sm_clock_mhz", _COUNT),
                     ("power_w", _COUNT), ("temperature_c", (-273.15, MAX_COUNT)),
                     ("xid_last", _COUNT))
    )
    + ") FROM gpu_samples)"
)  # fmt: skip


def _df(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> pd.DataFrame:
    return con.execute(sql, params).df()


def _summary_select() -> str:
    errs = ", ".join(f"'{s}'" for s in ERROR_STATUSES)
    return f"""
               count(*) AS n,
               count(*) FILTER (WHERE status IN ({errs})) AS n_err,
               quantile_cont(coalesce(ttft_s, client_ttft_s), 0.5) AS ttft_p50,
               quantile_cont(coalesce(ttft_s, client_ttft_s), 0.95) AS ttft_p95,
               quantile_cont(coalesce(ttft_s, client_ttft_s), 0.99) AS ttft_p99,
               quantile_cont(tpot_s, 0.5) AS tpot_p50,
               quantile_cont(tpot_s, 0.95) AS tpot_p95,
               quantile_cont(coalesce(e2e_s, client_e2e_s), 0.99) AS e2e_p99,
               avg(coalesce(ttft_s, client_ttft_s)) AS ttft_mean,
               stddev_samp(coalesce(ttft_s, client_ttft_s)) AS ttft_sd,
               avg(queue_s) AS queue_mean,
               avg(prefill_s) AS prefill_mean,
               avg(greatest(ttft_s - queue_s - prefill_s, 0)) AS frontend_mean,
               avg(prompt_tokens) AS prompt_mean,
               avg(output_tokens) AS output_mean,
               count(queue_s) AS n_timed,
               mode(error_type) FILTER (WHERE status IN ({errs})) AS top_error,
               mode(http_status) FILTER (WHERE status IN ({errs})) AS top_http_status"""


def request_summary(
    con: duckdb.DuckDBPyConnection, replica: str | None, since: float, until: float
) -> dict[str, Any]:
    """Exact request statistics over [since, until) for one replica (None: all of them)."""
    where = "arrival_ts >= to_timestamp(?) AND arrival_ts < to_timestamp(?)"
    params: list[Any] = [since, until]
    if replica is not None:
        where += " AND coalesce(replica, '') = ?"
        params.append(replica)
    cur = con.execute(f"SELECT {_summary_select()} FROM {REQUESTS} WHERE {where}", params)
    row = cur.fetchone()
    names = [d[0] for d in cur.description or []]
    assert row is not None
    out = dict(zip(names, row, strict=True))
    out["since"], out["until"] = since, until
    return out


def request_summaries(
    con: duckdb.DuckDBPyConnection, since: float, until: float
) -> dict[str, dict[str, Any]]:
    """:func:`request_summary` of every replica in one pass."""
    cur = con.execute(
        f"""
        SELECT coalesce(replica, '') AS _replica, {_summary_select()}
        FROM {REQUESTS} WHERE arrival_ts >= to_timestamp(?) AND arrival_ts < to_timestamp(?)
        GROUP BY ALL
        """,
        [since, until],
    )
    names = [d[0] for d in cur.description or []]
    out: dict[str, dict[str, Any]] = {}
    for row in cur.fetchall():
        rec = dict(zip(names, row, strict=True))
        key = rec.pop("_replica")
        rec["since"], rec["until"] = since, until
        out[key] = rec
    return out


def data_bounds(con: duckdb.DuckDBPyConnection) -> tuple[float | None, float | None]:
    """Oldest and newest timestamps over requests, engine and GPU samples."""
    row = con.execute(
        """
        SELECT min(lo), max(hi) FROM (
            SELECT epoch(min(arrival_ts)) AS lo,
                   epoch(max(coalesce(finish_ts, arrival_ts))) AS hi FROM requests
            UNION ALL SELECT epoch(min(ts)), epoch(max(ts)) FROM engine_samples
            UNION ALL SELECT epoch(min(ts)), epoch(max(ts)) FROM gpu_samples
        )
        """
    ).fetchone()
    if not row:
        return None, None
    return row[0], row[1]


def request_buckets(
    con: duckdb.DuckDBPyConnection, origin: float, until: float, bucket_s: float
) -> pd.DataFrame:
    errs = ", ".join(f"'{s}'" for s in ERROR_STATUSES)
    return _df(
        con,
        f"""
        SELECT coalesce(replica, '') AS replica,
               CAST(floor((epoch(arrival_ts) - ?) / ?) AS BIGINT) AS bucket,
               count(*) AS n,
               count(*) FILTER (WHERE status IN ({errs})) AS n_err,
               quantile_cont(coalesce(ttft_s, client_ttft_s), 0.95) AS ttft_p95,
               quantile_cont(tpot_s, 0.5) AS tpot_p50,
               avg(queue_s) AS queue_mean,
               avg(prefill_s) AS prefill_mean,
               avg(greatest(ttft_s - queue_s - prefill_s, 0)) AS frontend_mean,
               avg(prompt_tokens) AS prompt_mean,
               count(queue_s) AS n_timed,
               min(epoch(arrival_ts)) AS first_t, max(epoch(arrival_ts)) AS last_t
        FROM {REQUESTS}
        WHERE arrival_ts >= to_timestamp(?) AND arrival_ts < to_timestamp(?)
        GROUP BY ALL ORDER BY replica, bucket
        """,
        [origin, bucket_s, origin, until],
    )


def finished_buckets(
    con: duckdb.DuckDBPyConnection, origin: float, until: float, bucket_s: float
) -> pd.DataFrame:
    return _df(
        con,
        f"""
        SELECT coalesce(replica, '') AS replica,
               CAST(floor((epoch(finish_ts) - ?) / ?) AS BIGINT) AS bucket,
               count(*) FILTER (WHERE status = 'ok') AS completed,
               sum(output_tokens) FILTER (WHERE status = 'ok') AS output_tokens
        FROM {REQUESTS}
        WHERE finish_ts >= to_timestamp(?) AND finish_ts < to_timestamp(?)
        GROUP BY ALL ORDER BY replica, bucket
        """,
        [origin, bucket_s, origin, until],
    )


def engine_buckets(
    con: duckdb.DuckDBPyConnection,
    origin: float,
    until: float,
    bucket_s: float,
    lookback_s: float,
) -> pd.DataFrame:
    # A sample whose counter is missing (not scraped, or not plausible) is skipped: the
    # increase across it is counted at the next sample that has the counter.
    deltas = ",\n".join(
        f"CASE WHEN lag({c} IGNORE NULLS) OVER w IS NULL OR {c} IS NULL THEN NULL "
        f"WHEN {c} < lag({c} IGNORE NULLS) OVER w THEN {c} "
        f"ELSE {c} - lag({c} IGNORE NULLS) OVER w END AS d_{n}"
        for c, n in _COUNTERS
    )
    resets = " OR ".join(f"{c} < lag({c} IGNORE NULLS) OVER w" for c, _ in _COUNTERS)
    sums = ",\n".join(f"sum(d_{n}) AS {n}" for _, n in _COUNTERS)
    sums_ts = ",\n".join(f"sum(d_{n}) AS d_{n}" for _, n in _COUNTERS)
    sane = ", ".join(
        f"{_sane(c, *(_COUNT if c != 'kv_usage_ratio' else (0.0, MAX_RATIO)))} AS {c}"
        for c in ("running", "waiting", "waiting_capacity", "waiting_deferred",
                  "kv_usage_ratio", *(c for c, _ in _COUNTERS))
    )  # fmt: skip
    return _df(
        con,
        f"""
        WITH pts AS (
            SELECT replica, model, coalesce(engine, '') AS engine, epoch(ts) AS t, {sane}
            FROM {ENGINE_SAMPLES}
            WHERE ts >= to_timestamp(?) AND ts < to_timestamp(?)
            -- Two samples of one engine at one instant (files stamped alike): keep the later
            -- state, so that their order cannot fake a counter reset.
            QUALIFY row_number() OVER (
                PARTITION BY replica, model, coalesce(engine, ''), ts
                ORDER BY generation_tokens_total DESC NULLS LAST,
                         prompt_tokens_total DESC NULLS LAST) = 1
        ), d AS (
            SELECT replica, t, running, waiting, waiting_capacity, waiting_deferred,
                   kv_usage_ratio, {deltas},
                   coalesce({resets}, FALSE) AS reset,
                   t - lag(t) OVER w AS gap_s
            FROM pts
            WINDOW w AS (PARTITION BY replica, model, engine ORDER BY t)
        ), per_ts AS (
            SELECT replica, t, sum(running) AS running, sum(waiting) AS waiting,
                   sum(waiting_capacity) AS waiting_capacity,
                   sum(waiting_deferred) AS waiting_deferred,
                   max(kv_usage_ratio) AS kv, {sums_ts}, bool_or(reset) AS reset,
                   max(gap_s) AS gap_s
            FROM d WHERE t >= ? GROUP BY replica, t
        )
        SELECT replica, CAST(floor((t - ?) / ?) AS BIGINT) AS bucket,
               count(*) AS samples, avg(running) AS running_mean, max(running) AS running_max,
               avg(waiting) AS waiting_mean, max(waiting) AS waiting_max,
               max(waiting_capacity) AS waiting_capacity_max,
               max(waiting_deferred) AS waiting_deferred_max,
               avg(kv) AS kv_mean, max(kv) AS kv_max, {sums},
               count(*) FILTER (WHERE reset) AS resets, max(gap_s) AS max_gap_s,
               min(t) AS first_t, max(t) AS last_t
        FROM per_ts GROUP BY ALL ORDER BY replica, bucket
        """,
        [origin - lookback_s, until, origin, origin, bucket_s],
    )


def gpu_buckets(
    con: duckdb.DuckDBPyConnection,
    origin: float,
    until: float,
    bucket_s: float,
    busy_util: float,
) -> pd.DataFrame:
    return _df(
        con,
        f"""
        SELECT coalesce(replica, coalesce(node, '') || '/' || gpu) AS replica,
               CAST(floor((epoch(ts) - ?) / ?) AS BIGINT) AS bucket,
               count(*) AS samples,
               avg(util_ratio) AS util_mean,
               quantile_cont(sm_clock_mhz, 0.5) FILTER (WHERE util_ratio >= ?) AS clock_busy,
               max(sm_clock_mhz) AS clock_max,
               avg(power_w) AS power_mean,
               max(temperature_c) AS temp_max,
               max(xid_last) AS xid_max,
               list(DISTINCT xid_last) FILTER (WHERE xid_last IS NOT NULL AND xid_last <> 0)
                   AS xids,
               list(DISTINCT gpu) AS gpus,
               min(epoch(ts)) AS first_t, max(epoch(ts)) AS last_t
        FROM {GPU_SAMPLES}
        WHERE ts >= to_timestamp(?) AND ts < to_timestamp(?)
        GROUP BY ALL ORDER BY replica, bucket
        """,
        [origin, bucket_s, busy_util, origin, until],
    )


#: ``router_samples``' counters whose increase per bucket ``router_buckets`` reports.
_ROUTER_COUNTERS: tuple[tuple[str, str], ...] = (
    ("requests_total", "requests"),
    ("errors_total", "errors"),
    ("errors_by_code['ResourceExhausted']", "rejected"),
)


def router_buckets(
    con: duckdb.DuckDBPyConnection, origin: float, until: float, bucket_s: float
) -> pd.DataFrame:
    """The gateway router's state per ``(replica, bucket)`` (``replica``: the router's name):
    its flow-control queue (summed over pools and models per scrape; mean and peak), the pool
    saturation it gates on and the pool averages it reports (KV usage, engine queue), and
    request, error and ``ResourceExhausted`` increases (a decrease is a reset). Empty where the
    store has no ``router_samples`` table (a lake exported before routers were scraped)."""
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'router_samples'"
    ).fetchone()
    if not exists or not exists[0]:
        return _df(con, "SELECT NULL::VARCHAR AS replica, NULL::BIGINT AS bucket WHERE false", [])
    sane = ", ".join(
        f"{_sane(c, *(_COUNT if c != 'avg_kv_usage_ratio' else (0.0, MAX_RATIO)))} AS {c}"
        for c in ("flow_queue_size", "pool_saturation", "avg_kv_usage_ratio", "avg_queue_size",
                  "running")
    )  # fmt: skip
    counters = ", ".join(f"{_sane(c, *_COUNT)} AS c_{n}" for c, n in _ROUTER_COUNTERS)
    deltas = ",\n".join(
        f"CASE WHEN lag(c_{n} IGNORE NULLS) OVER w IS NULL OR c_{n} IS NULL THEN NULL "
        f"WHEN c_{n} < lag(c_{n} IGNORE NULLS) OVER w THEN c_{n} "
        f"ELSE c_{n} - lag(c_{n} IGNORE NULLS) OVER w END AS d_{n}"
        for _, n in _ROUTER_COUNTERS
    )
    sums_ts = ", ".join(f"sum(d_{n}) AS d_{n}" for _, n in _ROUTER_COUNTERS)
    sums = ", ".join(f"sum(d_{n}) AS {n}" for _, n in _ROUTER_COUNTERS)
    return _df(
        con,
        f"""
        WITH pts AS (
            SELECT router AS replica, coalesce(pool, '') AS pool, coalesce(model, '') AS model,
                   epoch(ts) AS t, {sane}, {counters}
            FROM router_samples
            WHERE ts >= to_timestamp(?) AND ts < to_timestamp(?)
        ), d AS (
            SELECT *, {deltas} FROM pts
            WINDOW w AS (PARTITION BY replica, pool, model ORDER BY t)
        ), per_ts AS (
            SELECT replica, t, sum(flow_queue_size) AS queue, max(pool_saturation) AS sat,
                   avg(avg_kv_usage_ratio) AS pool_kv, avg(avg_queue_size) AS pool_queue,
                   sum(running) AS running, {sums_ts}
            FROM d WHERE t >= ? GROUP BY replica, t
        )
        SELECT replica, CAST(floor((t - ?) / ?) AS BIGINT) AS bucket,
               count(*) AS samples, avg(queue) AS queue_mean, max(queue) AS queue_max,
               avg(sat) AS saturation_mean, max(sat) AS saturation_max,
               avg(pool_kv) AS pool_kv_mean, avg(pool_queue) AS pool_queue_mean,
               avg(running) AS running_mean, {sums},
               min(t) AS first_t, max(t) AS last_t
        FROM per_ts GROUP BY ALL ORDER BY replica, bucket
        """,
        [origin - 3 * bucket_s, until, origin, origin, bucket_s],
    )
