"""Where telemetry stopped: the last sample before a window, gaps in a source's samples,
and failed scrapes. The questions the ``telemetry_gap`` rule asks of the store."""

from __future__ import annotations

from typing import Any, Literal

import duckdb

#: A telemetry source: ``spans`` are requests that carry vLLM's own timing split.
Source = Literal["requests", "spans", "engine", "gpu"]

_LAST_SEEN: dict[str, tuple[str, str, str]] = {
    "requests": ("requests", "arrival_ts", "TRUE"),
    "spans": ("requests", "arrival_ts", "queue_s IS NOT NULL"),
    "engine": ("engine_samples", "ts", "TRUE"),
    "gpu": ("gpu_samples", "ts", "TRUE"),
}

#: Sampled sources: their table and the key that names one stream of samples.
_SAMPLED: dict[str, tuple[str, str]] = {
    "engine": ("engine_samples", "replica"),
    "gpu": ("gpu_samples", "coalesce(replica, coalesce(node, '') || '/' || gpu)"),
}


def last_seen(con: duckdb.DuckDBPyConnection, source: str, before: float) -> float | None:
    """The newest timestamp of ``source`` strictly before ``before`` (None: never seen)."""
    table, col, cond = _LAST_SEEN[source]
    row = con.execute(
        f"SELECT epoch(max({col})) FROM {table} WHERE {cond} AND {col} < to_timestamp(?)",
        [before],
    ).fetchone()
    return float(row[0]) if row and row[0] is not None else None


def sample_gaps(
    con: duckdb.DuckDBPyConnection,
    source: str,
    since: float,
    until: float,
    *,
    stale_factor: float,
    min_gap_s: float,
) -> list[tuple[str, float, float, float | None]]:
    """Gaps in a sampled source over [since, until]: ``(stream, start, end, usual interval)``
    for each interval longer than ``stale_factor`` times the stream's median interval (and at
    least ``min_gap_s``), including a stream that went silent before ``until``."""
    table, key = _SAMPLED[source]
    rows = con.execute(
        f"""
        WITH pts AS (
            SELECT DISTINCT {key} AS replica, epoch(ts) AS t FROM {table}
            WHERE ts >= to_timestamp(?) AND ts <= to_timestamp(?)
        ), d AS (
            SELECT replica, t, t - lag(t) OVER (PARTITION BY replica ORDER BY t) AS gap
            FROM pts
        ), usual AS (
            SELECT replica, quantile_cont(gap, 0.5) AS med, max(t) AS last_t FROM d
            GROUP BY replica
        )
        SELECT d.replica, d.t - d.gap AS gap_start, d.t AS gap_end, usual.med
        FROM d JOIN usual USING (replica)
        WHERE d.gap > greatest(? * usual.med, ?)
        UNION ALL
        SELECT replica, last_t, ?, med FROM usual
        WHERE ? - last_t > greatest(? * med, ?)
        ORDER BY 1, 2
        """,
        [since, until, stale_factor, min_gap_s, until, until, stale_factor, min_gap_s],
    ).fetchall()
    return [(str(r), float(s), float(e), None if m is None else float(m)) for r, s, e, m in rows]


def failed_scrapes(
    con: duckdb.DuckDBPyConnection, since: float, until: float
) -> list[dict[str, Any]]:
    """Failed scrapes in [since, until] per kind and target: count, first, last, usual error."""
    cur = con.execute(
        """
        SELECT kind, target, replica, count(*) AS failed, epoch(min(ts)) AS first,
               epoch(max(ts)) AS last, mode(error) AS error
        FROM scrapes
        WHERE NOT up AND ts >= to_timestamp(?) AND ts <= to_timestamp(?)
        GROUP BY ALL ORDER BY kind, target
        """,
        [since, until],
    )
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
