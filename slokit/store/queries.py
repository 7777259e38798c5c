"""Read queries over the store. Analysis code reads through these, never writes.

Times in and out are epoch seconds (float). Counter rates handle resets: a decrease between two
samples is a reset, and the increase over it is the new value (Prometheus ``increase`` semantics).
"""

from __future__ import annotations

from typing import Any

import duckdb

from slokit.ids import candidate_ids

_REQUEST_TS = ("arrival_ts", "first_token_ts", "finish_ts", "updated_at")


def _row_dict(cur: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
    row = cur.fetchone()
    if row is None:
        return None
    names = [d[0] for d in cur.description or []]
    return dict(zip(names, row, strict=True))


def get_request(con: duckdb.DuckDBPyConnection, request_id: str) -> dict[str, Any] | None:
    """The merged record for any accepted form of the id (``r24``, ``cmpl-r24-0``...)."""
    ts_cols = ", ".join(f"epoch({c}) AS {c}" for c in _REQUEST_TS)
    for rid in candidate_ids(request_id):
        cur = con.execute(
            f"SELECT * EXCLUDE ({', '.join(_REQUEST_TS)}), {ts_cols} "
            "FROM requests WHERE request_id = ? LIMIT 1",
            [rid],
        )
        rec = _row_dict(cur)
        if rec is not None:
            return rec
    return None


def data_span(con: duckdb.DuckDBPyConnection) -> tuple[float | None, float | None]:
    """Oldest and newest timestamp the store holds (requests and engine samples)."""
    row = con.execute(
        """
        SELECT min(lo), max(hi) FROM (
            SELECT epoch(min(arrival_ts)) AS lo, epoch(max(coalesce(finish_ts, arrival_ts))) AS hi
            FROM requests
            UNION ALL
            SELECT epoch(min(ts)), epoch(max(ts)) FROM engine_samples
        )
        """
    ).fetchone()
    if not row:
        return None, None
    return row[0], row[1]


def percentile_ranks(
    con: duckdb.DuckDBPyConnection,
    *,
    values: dict[str, float | None],
    since: float,
    until: float,
    slo_class: str | None,
    model: str | None = None,
) -> dict[str, Any]:
    """Mid-rank percentile of each value among peers (same class, arrival in the window):
    the fraction below it plus half the fraction equal to it."""
    metrics = [k for k, v in values.items() if v is not None]
    if not metrics:
        return {"peers": 0, "ranks": {}}
    sel = ", ".join(
        f"avg(CASE WHEN {m} < ? THEN 1.0 WHEN {m} = ? THEN 0.5 ELSE 0.0 END) "
        f"FILTER (WHERE {m} IS NOT NULL), "
        f"quantile_cont({m}, 0.5), quantile_cont({m}, 0.95)"
        for m in metrics
    )
    params: list[Any] = [v for m in metrics for v in (values[m], values[m])]
    where = "arrival_ts BETWEEN to_timestamp(?) AND to_timestamp(?) AND status = 'ok'"
    params += [since, until]
    if slo_class is not None:
        where += " AND slo_class = ?"
        params.append(slo_class)
    if model is not None:
        where += " AND model = ?"
        params.append(model)
    row = con.execute(f"SELECT count(*), {sel} FROM requests WHERE {where}", params).fetchone()
    assert row is not None
    ranks: dict[str, Any] = {}
    for i, m in enumerate(metrics):
        rank, p50, p95 = row[1 + 3 * i : 4 + 3 * i]
        ranks[m] = {"rank": rank, "p50": p50, "p95": p95}
    return {"peers": int(row[0]), "ranks": ranks}


def counter_increase(
    con: duckdb.DuckDBPyConnection,
    *,
    table: str,
    column: str,
    replica: str,
    since: float,
    until: float,
) -> dict[str, Any]:
    """Increase of a cumulative counter over [since, until], counting resets.

    Uses the last sample at or before ``since`` as the starting point when there is one.
    Returns ``{"increase", "samples", "resets"}``; increase is None with fewer than 2 samples.
    """
    row = con.execute(
        f"""
        WITH pts AS (
            SELECT ts, {column} AS v FROM {table}
            WHERE replica = ? AND {column} IS NOT NULL
              AND ts <= to_timestamp(?)
              AND ts >= coalesce(
                  (SELECT max(ts) FROM {table}
                   WHERE replica = ? AND {column} IS NOT NULL AND ts <= to_timestamp(?)),
                  to_timestamp(?))
        ), d AS (
            SELECT v, lag(v) OVER (ORDER BY ts) AS prev FROM pts
        )
        SELECT count(*),
               sum(CASE WHEN prev IS NULL THEN 0 WHEN v < prev THEN v ELSE v - prev END),
               count(*) FILTER (WHERE prev IS NOT NULL AND v < prev)
        FROM d
        """,
        [replica, until, replica, since, since],
    ).fetchone()
    assert row is not None
    n = int(row[0])
    return {"increase": float(row[1]) if n >= 2 else None, "samples": n, "resets": int(row[2] or 0)}


def gpu_state_at(
    con: duckdb.DuckDBPyConnection, replica: str, ts: float, *, max_age_s: float
) -> dict[str, Any] | None:
    cur = con.execute(
        """
        SELECT epoch(ts) AS ts, gpu, util_ratio, mem_used_mib, mem_total_mib, power_w,
               temperature_c, sm_clock_mhz, xid_last
        FROM gpu_samples
        WHERE replica = ? AND ts <= to_timestamp(?) AND ts >= to_timestamp(?)
        ORDER BY ts DESC LIMIT 1
        """,
        [replica, ts, ts - max_age_s],
    )
    return _row_dict(cur)


def findings_overlapping(
    con: duckdb.DuckDBPyConnection, replica: str | None, since: float, until: float
) -> list[dict[str, Any]]:
    """Findings whose window overlaps [since, until] for this replica or the whole fleet."""
    cur = con.execute(
        """
        SELECT rule, severity, confidence, replica, epoch(start_ts) AS start_ts,
               epoch(end_ts) AS end_ts, summary, runbook
        FROM findings
        WHERE start_ts <= to_timestamp(?) AND end_ts >= to_timestamp(?)
          AND (replica IS NULL OR replica = ?)
        ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END,
                 confidence DESC
        """,
        [until, since, replica],
    )
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def has_rows(con: duckdb.DuckDBPyConnection, table: str, replica: str | None = None) -> bool:
    if replica is None:
        row = con.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()
    else:
        row = con.execute(
            f"SELECT EXISTS (SELECT 1 FROM {table} WHERE replica = ?)", [replica]
        ).fetchone()
    return bool(row and row[0])


ENGINE_WINDOW_COLUMNS = (
    "ts", "running", "waiting", "kv_usage_ratio", "preemptions_total",
    "prefix_cache_queries_total", "prefix_cache_hits_total", "num_gpu_blocks",
)  # fmt: skip


def engine_window(
    con: duckdb.DuckDBPyConnection, replica: str, since: float, until: float
) -> list[dict[str, Any]]:
    """The replica's engine samples in [since, until], oldest first, as dicts (ts in epoch s)."""
    cols = ", ".join("epoch(ts) AS ts" if c == "ts" else c for c in ENGINE_WINDOW_COLUMNS)
    rows = con.execute(
        f"SELECT {cols} FROM engine_samples "
        "WHERE replica = ? AND ts BETWEEN to_timestamp(?) AND to_timestamp(?) ORDER BY ts",
        [replica, since, until],
    ).fetchall()
    return [dict(zip(ENGINE_WINDOW_COLUMNS, r, strict=True)) for r in rows]


def increase(values: list[float]) -> tuple[float | None, int]:
    """Increase of a cumulative counter over consecutive samples, and the resets seen.

    The same semantics as :func:`counter_increase`, for samples already in memory."""
    total, resets, prev = 0.0, 0, None
    for v in values:
        if prev is not None:
            if v < prev:
                resets += 1
                total += v
            else:
                total += v - prev
        prev = v
    return (total if len(values) >= 2 else None), resets


def peer_count(
    con: duckdb.DuckDBPyConnection, since: float, until: float, slo_class: str | None
) -> int:
    where = "arrival_ts BETWEEN to_timestamp(?) AND to_timestamp(?)"
    params: list[Any] = [since, until]
    if slo_class is not None:
        where += " AND slo_class = ?"
        params.append(slo_class)
    rows = con.execute(f"SELECT count(*) FROM requests WHERE {where}", params).fetchall()
    return int(rows[0][0])
