"""Point and series queries over the local store, behind :class:`slokit.store.reader.LocalReader`.

Times in and out are epoch seconds (float). Counter rates handle resets: a decrease between two
samples is a reset, and the increase over it is the new value (Prometheus ``increase`` semantics).
"""

from __future__ import annotations

from typing import Any

import duckdb

from slokit.errors import BadInput
from slokit.ids import candidate_ids
from slokit.store.migrations import LOCAL_REQUEST_COLUMNS

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
            for c in LOCAL_REQUEST_COLUMNS:  # the SLI's bookkeeping (a lake has none)
                rec.pop(c, None)
            _add_routing(con, rec)
            return rec
    return None


def _add_routing(con: duckdb.DuckDBPyConnection, rec: dict[str, Any]) -> None:
    """``gateway_routing_s`` (a fragment fact, not a ``requests`` column) into a gateway's
    record, when a router reported it; a store without fragments (a lake) has none."""
    if "gateway" not in (rec.get("sources") or ()):
        return
    try:
        rows = con.execute(
            "SELECT max(gateway_routing_s) FROM request_fragments WHERE request_id = ?",
            [rec["request_id"]],
        ).fetchall()
    except duckdb.CatalogException:
        return
    if rows and rows[0][0] is not None:
        rec["gateway_routing_s"] = float(rows[0][0])


def unjoined(
    con: duckdb.DuckDBPyConnection, since: float | None, until: float | None
) -> dict[str, int]:
    """Spans that never joined a request by trace id, by reason, dropped in ``[since,
    until)`` (slokit.store._trace_join); empty for a store without the table."""
    where, params = _between("ts", since, until)
    sql = f"SELECT reason, sum(count) FROM unjoined_spans WHERE {where} GROUP BY 1 ORDER BY 1"
    try:
        rows = con.execute(sql, params).fetchall()
    except duckdb.CatalogException:
        return {}
    return {str(r): int(n) for r, n in rows}


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


#: Engine counters a reader may be asked to increase (column names, never SQL from callers).
ENGINE_COUNTERS = frozenset(
    {
        "preemptions_total", "prompt_tokens_total", "generation_tokens_total",
        "prefix_cache_queries_total", "prefix_cache_hits_total", "request_success_total",
        "spec_decode_drafts_total", "spec_decode_draft_tokens_total",
        "spec_decode_accepted_tokens_total",
    }
)  # fmt: skip


def engine_counter(column: str) -> str:
    """``column`` if it is an engine counter; BadInput otherwise (it becomes SQL text)."""
    if column not in ENGINE_COUNTERS:
        raise BadInput(f"not an engine counter: {column!r}")
    return column


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


_RECORD_COLUMNS = (
    "request_id", "replica", "model", "tenant", "slo_class", "task_id", "client_ttft_s",
    "client_e2e_s", "ttft_s", "queue_s", "prefill_s", "decode_s", "e2e_s", "tpot_s",
    "itl_p95_s", "prompt_tokens", "output_tokens", "status", "quality_pass",
)  # fmt: skip
_RECORD_TS_COLUMNS = ("arrival_ts", "first_token_ts", "finish_ts")


def _between(
    column: str, since: float | None, until: float | None, *, closed: bool = True
) -> tuple[str, list[Any]]:
    """SQL condition and parameters: ``column`` in [since, until] (``closed``) or [since, until)."""
    where, params = ["TRUE"], []
    if since is not None:
        where.append(f"{column} >= to_timestamp(?)")
        params.append(since)
    if until is not None:
        where.append(f"{column} {'<=' if closed else '<'} to_timestamp(?)")
        params.append(until)
    return " AND ".join(where), params


def load_records(
    con: duckdb.DuckDBPyConnection, since: float | None = None, until: float | None = None
) -> list[dict[str, Any]]:
    """Merged request records (times as epoch seconds) arriving in ``[since, until)``."""
    cols = (
        ", ".join(_RECORD_COLUMNS)
        + ", "
        + ", ".join(f"epoch({c}) AS {c}" for c in _RECORD_TS_COLUMNS)
    )
    where, params = _between("arrival_ts", since, until, closed=False)
    cur = con.execute(
        f"SELECT {cols} FROM requests WHERE {where} ORDER BY arrival_ts NULLS LAST, request_id",
        params,
    )
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


#: Where the next page of :func:`requests_page` starts: after the record with this arrival
#: (epoch microseconds; None among the records with no arrival) and this request id.
PageKey = tuple[int | None, str]


def requests_page(
    con: duckdb.DuckDBPyConnection,
    since: float | None,
    until: float | None,
    after: PageKey | None,
    limit: int,
) -> tuple[list[dict[str, Any]], PageKey | None]:
    """One page of :func:`load_records`: the same records in the same order (arrival, then
    id; records with no arrival last, only when the window is open at both ends), at most
    ``limit`` after ``after``, and the key of the next page (None: this was the last)."""
    cols = (
        ", ".join(_RECORD_COLUMNS)
        + ", "
        + ", ".join(f"epoch({c}) AS {c}" for c in _RECORD_TS_COLUMNS)
    )
    where, params = _between("arrival_ts", since, until, closed=False)
    if after is not None:
        at, rid = after
        if at is None:
            where += " AND arrival_ts IS NULL AND request_id > ?"
            params.append(rid)
        else:
            where += (
                " AND (epoch_us(arrival_ts) > ? OR (epoch_us(arrival_ts) = ? AND request_id > ?)"
                " OR arrival_ts IS NULL)"
            )
            params += [at, at, rid]
    cur = con.execute(
        f"SELECT {cols}, epoch_us(arrival_ts) AS _arrival_us FROM requests WHERE {where} "
        "ORDER BY arrival_ts NULLS LAST, request_id LIMIT ?",
        [*params, limit + 1],
    )
    names = [d[0] for d in cur.description or []]
    rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    more = len(rows) > limit
    rows = rows[:limit]
    keys = [(r.pop("_arrival_us"), r["request_id"]) for r in rows]
    return rows, (keys[-1] if more else None)


def energy_increase(
    con: duckdb.DuckDBPyConnection, since: float | None, until: float | None
) -> float | None:
    """Joules used by all GPUs over ``[since, until]``, from cumulative ``energy_j``
    (a decrease is a reset: the increase over it is the new value). None without data."""
    where, params = _between("ts", since, until)
    row = con.execute(
        f"""
        WITH d AS (
            SELECT energy_j AS v,
                   lag(energy_j) OVER (PARTITION BY coalesce(node, ''), gpu ORDER BY ts) AS prev
            FROM gpu_samples WHERE energy_j IS NOT NULL AND {where}
        )
        SELECT count(*) FILTER (WHERE prev IS NOT NULL),
               sum(CASE WHEN prev IS NULL THEN 0 WHEN v < prev THEN v ELSE v - prev END)
        FROM d
        """,
        params,
    ).fetchone()
    if not row or not row[0]:
        return None
    return float(row[1])


def engine_series(
    con: duckdb.DuckDBPyConnection, since: float | None, until: float | None
) -> dict[str, list[tuple[float, float | None, float | None]]]:
    """Replica -> [(ts, running, waiting)] from the engine samples in the window."""
    where, params = _between("ts", since, until)
    out: dict[str, list[tuple[float, float | None, float | None]]] = {}
    for replica, ts, running, waiting in con.execute(
        f"SELECT replica, epoch(ts), running, waiting FROM engine_samples WHERE {where} "
        "ORDER BY ts",
        params,
    ).fetchall():
        out.setdefault(str(replica), []).append((float(ts), running, waiting))
    return out


def stored_findings(
    con: duckdb.DuckDBPyConnection, since: float | None, until: float | None, limit: int = 200
) -> list[dict[str, Any]]:
    """Findings overlapping the window: the most severe first, then the newest."""
    where, params = ["TRUE"], []
    if since is not None:
        where.append("end_ts >= to_timestamp(?)")
        params.append(since)
    if until is not None:
        where.append("start_ts <= to_timestamp(?)")
        params.append(until)
    rows = con.execute(
        "SELECT rule, severity, confidence, replica, epoch(start_ts), epoch(end_ts), summary, "
        f"runbook FROM findings WHERE {' AND '.join(where)} "
        "ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END,"
        " start_ts DESC LIMIT ?",
        [*params, limit],
    ).fetchall()
    keys = ("rule", "severity", "confidence", "replica", "start", "end", "summary", "runbook")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def cache_config(con: duckdb.DuckDBPyConnection) -> dict[str, float] | None:
    """The newest ``num_gpu_blocks`` and ``block_size`` the engine samples carry."""
    row = con.execute(
        "SELECT num_gpu_blocks, block_size FROM engine_samples "
        "WHERE num_gpu_blocks IS NOT NULL AND block_size IS NOT NULL ORDER BY ts DESC LIMIT 1"
    ).fetchone()
    if not row:
        return None
    return {"num_gpu_blocks": float(row[0]), "block_size": float(row[1])}


def slowest_request(con: duckdb.DuckDBPyConnection, *, source: str = "vllm") -> str | None:
    """The successful request with ``source``'s fragment that waited longest for its first
    token (client TTFT where known)."""
    rows = con.execute(
        "SELECT request_id FROM requests WHERE status = 'ok' AND list_contains(sources, ?) "
        "ORDER BY coalesce(client_ttft_s, ttft_s) DESC NULLS LAST LIMIT 1",
        [source],
    ).fetchall()
    return str(rows[0][0]) if rows else None


def first_seen_between(
    con: duckdb.DuckDBPyConnection, lo: float, hi: float
) -> list[dict[str, Any]]:
    """Merged records of the requests whose first fragment was ingested in ``(lo, hi]``
    (``first_ingested_at``, which the merge keeps). Rows are appended as their requests are
    first seen, or merged again soon after, so the column's zone maps leave only the newest
    row groups to read: a tick's cost follows the window's requests, not the file's age.
    Times are not read: the SLI judges durations and outcomes only."""
    cur = con.execute(
        f"SELECT {', '.join(_RECORD_COLUMNS)} FROM requests "
        "WHERE first_ingested_at > to_timestamp(?) AND first_ingested_at <= to_timestamp(?)",
        [lo, hi],
    )
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
