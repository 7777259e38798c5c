"""The data every rule reads: one window of the store, bucketed once, plus its baseline.

:func:`build_context` runs a handful of set-wise DuckDB queries and hands the rules pandas
DataFrames keyed by ``(replica, bucket)``:

``requests``  by arrival bucket: counts, errors, TTFT/TPOT/E2E percentiles, mean queue,
              prefill and frontend time (TTFT not spent in the engine), prompt length.
``finished``  completions by finish bucket (throughput).
``engine``    vLLM gauges (running, waiting, KV usage) averaged and peaked per bucket, and
              counter increases per bucket with reset handling (a decrease is a reset, the
              increase across it is the new value), plus the number of resets.
``gpu``       GPU utilisation, SM clock (median while busy), power, temperature, last XID.

The **baseline** is what "normal" means for the relative rules: the data just before the
window when there is enough of it (the replica's own recent history), otherwise the first
part of the window (an earlier, hopefully quiet, period). Relative rules look for change
after the baseline (``detect_since``); rules about physical limits look at the whole window.

Rows with no replica (client-only records) are grouped under the replica ``""``; rules
report them as the fleet (``replica=None``).

Values outside the plausible range of :mod:`slokit.sources.validate` (NaN, infinities, a
counter past 2**53, a negative latency: stored before validation existed, or by another
writer) are read as NULL, a missing fact, so no rule computes with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pandas as pd

from slokit.sources.validate import MAX_COUNT, MAX_DURATION_S, MAX_RATIO, MAX_TOKENS

#: Sources a rule may need. ``spans`` means requests carrying vLLM's own timing split
#: (queue/prefill/decode from the ``llm_request`` span), not just client timings.
SOURCES: tuple[str, ...] = ("requests", "spans", "engine", "gpu")

#: Request statuses that count as failures (``cancelled`` is the client's choice).
ERROR_STATUSES: tuple[str, ...] = ("error", "timeout", "rejected")

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
    + ") FROM requests)"
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


@dataclass(frozen=True)
class DiagnoseOptions:
    """Knobs of the engine. Factors are relative to the baseline; the few absolute numbers
    are physical limits (KV usage near 1.0) or sample-size floors."""

    bucket_s: float = 10.0
    baseline_fraction: float = 0.25  # first part of the window when nothing precedes it
    baseline_lookback_s: float = 3600.0  # own history before the window used as baseline
    min_baseline_buckets: int = 3
    min_requests: int = 20  # per side before percentiles are compared
    min_bucket_requests: int = 3  # a bucket with fewer requests says nothing on its own
    ttft_factor: float = 2.0  # TTFT p95 this many times the baseline is "up" (info)
    warning_factor: float = 3.0  # ...this many times is worth a warning
    min_z: float = 3.0  # a mean shift must be this many standard errors to count
    tpot_flat_factor: float = 1.3  # TPOT within this factor of the baseline is "flat"
    tpot_factor: float = 1.5  # TPOT this many times the baseline is "up"
    batch_factor: float = 1.5  # running batch this many times the baseline has "grown"
    critical_factor: float = 5.0  # a latency this many times its baseline is critical
    kv_full_ratio: float = 0.95  # physical: the KV pool is (nearly) full
    idle_util_ratio: float = 0.5  # GPU below this while requests wait is not the bottleneck
    busy_util_ratio: float = 0.3  # clocks are only compared while the GPU is this busy
    clock_drop_ratio: float = 0.85  # SM clock below this share of its baseline: throttled
    error_factor: float = 3.0
    error_min_count: int = 5
    error_min_ratio: float = 0.02  # an error share below this is noise, whatever its growth
    prefix_drop_ratio: float = 0.3  # relative fall of the prefix hit ratio
    prefix_min_abs_drop: float = 0.1
    spec_drop_ratio: float = 0.3  # relative fall of the draft acceptance rate
    spec_min_tokens_per_step: float = 1.5  # below this speculative decoding rarely pays
    knee_arrival_growth: float = 1.2
    knee_backlog_ratio: float = 0.1  # backlog growth over the last third, share of its arrivals
    stale_factor: float = 3.0  # a gap this many times the usual interval is a gap
    min_gap_s: float = 30.0  # ...and at least this long


@dataclass
class SourceInfo:
    name: str
    rows: int = 0
    replicas: list[str] = field(default_factory=list)
    first_ts: float | None = None
    last_ts: float | None = None

    @property
    def present(self) -> bool:
        return self.rows > 0

    def to_json(self) -> dict[str, Any]:
        from slokit.timeutil import iso

        return {
            "present": self.present,
            "rows": self.rows,
            "replicas": self.replicas,
            "first": iso(self.first_ts),
            "last": iso(self.last_ts),
        }


@dataclass
class DiagnoseContext:
    con: duckdb.DuckDBPyConnection
    options: DiagnoseOptions
    since: float
    until: float
    base_since: float
    base_until: float
    detect_since: float
    baseline_source: str  # "history" (before the window) | "window start"
    origin: float  # bucket 0 starts here
    requests: pd.DataFrame
    finished: pd.DataFrame
    engine: pd.DataFrame
    gpu: pd.DataFrame
    sources: dict[str, SourceInfo]
    notes: dict[str, list[str]] = field(default_factory=dict)
    withheld: dict[str, str] = field(default_factory=dict)  # rule id -> why (set by diagnose)
    cache: dict[str, Any] = field(default_factory=dict)  # results shared between rules
    _summary_cache: dict[tuple[str, float, float], dict[str, Any]] = field(default_factory=dict)

    # -- helpers for rules -----------------------------------------------------------------
    def note(self, rule: str, text: str) -> None:
        """Say in the coverage why a rule could not judge something."""
        self.notes.setdefault(rule, []).append(text)

    def has(self, source: str) -> bool:
        return self.sources[source].present

    def bucket_start(self, bucket: int | float) -> float:
        return self.origin + float(bucket) * self.options.bucket_s

    def bucket_end(self, bucket: int | float) -> float:
        return min(self.until, self.bucket_start(bucket) + self.options.bucket_s)

    def is_baseline(self, frame: pd.DataFrame) -> pd.Series:
        t = self.origin + frame["bucket"] * self.options.bucket_s
        return (t >= self.base_since) & (t < self.base_until)

    def is_detect(self, frame: pd.DataFrame) -> pd.Series:
        t = self.origin + frame["bucket"] * self.options.bucket_s
        return t >= self.detect_since

    def in_window(self, frame: pd.DataFrame) -> pd.Series:
        t = self.origin + frame["bucket"] * self.options.bucket_s
        return t >= self.since - 1e-9

    def request_summary(self, replica: str | None, since: float, until: float) -> dict[str, Any]:
        """Exact request statistics over [since, until) for one replica (or all: None)."""
        key = (replica if replica is not None else "\x00all", since, until)
        if key not in self._summary_cache:
            self._summary_cache[key] = request_summary(self.con, replica, since, until)
        return self._summary_cache[key]

    def baseline_summary(self, replica: str | None) -> dict[str, Any]:
        """The baseline's request statistics (all replicas summarised in one query)."""
        if replica is None:
            return self.request_summary(None, self.base_since, self.base_until)
        if "_baseline" not in self.cache:
            self.cache["_baseline"] = request_summaries(self.con, self.base_since, self.base_until)
        found = self.cache["_baseline"].get(replica)
        if found is None:  # no requests there: an empty summary
            found = self.request_summary(replica, self.base_since, self.base_until)
        return dict(found)

    def of(self, frame_name: str, replica: str) -> pd.DataFrame:
        """Rows of one bucketed frame for one replica (split once, then cached)."""
        key = f"_split_{frame_name}"
        if key not in self.cache:
            frame: pd.DataFrame = getattr(self, frame_name)
            self.cache[key] = {str(r): g for r, g in frame.groupby("replica")}
        split: dict[str, pd.DataFrame] = self.cache[key]
        if replica in split:
            return split[replica]
        empty: pd.DataFrame = getattr(self, frame_name).iloc[0:0]
        return empty


def _frame(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> pd.DataFrame:
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


def _sources(ctx: DiagnoseContext) -> dict[str, SourceInfo]:
    """What each source holds inside the window, read off the bucketed frames."""
    out: dict[str, SourceInfo] = {}
    for name, frame, count in (
        ("requests", ctx.requests, "n"),
        ("spans", ctx.requests, "n_timed"),
        ("engine", ctx.engine, "samples"),
        ("gpu", ctx.gpu, "samples"),
    ):
        rows = frame[ctx.in_window(frame) & (frame[count] > 0)] if not frame.empty else frame
        if rows.empty:
            out[name] = SourceInfo(name)
            continue
        out[name] = SourceInfo(
            name,
            int(rows[count].sum()),
            sorted(str(r) for r in rows["replica"].unique()),
            float(rows["first_t"].min()),
            float(rows["last_t"].max()),
        )
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


def _request_buckets(
    con: duckdb.DuckDBPyConnection, origin: float, until: float, bucket_s: float
) -> pd.DataFrame:
    errs = ", ".join(f"'{s}'" for s in ERROR_STATUSES)
    return _frame(
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


def _finished_buckets(
    con: duckdb.DuckDBPyConnection, origin: float, until: float, bucket_s: float
) -> pd.DataFrame:
    return _frame(
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


def _engine_buckets(
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
        for c in ("running", "waiting", "kv_usage_ratio", *(c for c, _ in _COUNTERS))
    )
    return _frame(
        con,
        f"""
        WITH pts AS (
            SELECT replica, model, coalesce(engine, '') AS engine, epoch(ts) AS t, {sane}
            FROM engine_samples
            WHERE ts >= to_timestamp(?) AND ts < to_timestamp(?)
            -- Two samples of one engine at one instant (files stamped alike): keep the later
            -- state, so that their order cannot fake a counter reset.
            QUALIFY row_number() OVER (
                PARTITION BY replica, model, coalesce(engine, ''), ts
                ORDER BY generation_tokens_total DESC NULLS LAST,
                         prompt_tokens_total DESC NULLS LAST) = 1
        ), d AS (
            SELECT replica, t, running, waiting, kv_usage_ratio, {deltas},
                   coalesce({resets}, FALSE) AS reset,
                   t - lag(t) OVER w AS gap_s
            FROM pts
            WINDOW w AS (PARTITION BY replica, model, engine ORDER BY t)
        ), per_ts AS (
            SELECT replica, t, sum(running) AS running, sum(waiting) AS waiting,
                   max(kv_usage_ratio) AS kv, {sums_ts}, bool_or(reset) AS reset,
                   max(gap_s) AS gap_s
            FROM d WHERE t >= ? GROUP BY replica, t
        )
        SELECT replica, CAST(floor((t - ?) / ?) AS BIGINT) AS bucket,
               count(*) AS samples, avg(running) AS running_mean, max(running) AS running_max,
               avg(waiting) AS waiting_mean, max(waiting) AS waiting_max,
               avg(kv) AS kv_mean, max(kv) AS kv_max, {sums},
               count(*) FILTER (WHERE reset) AS resets, max(gap_s) AS max_gap_s,
               min(t) AS first_t, max(t) AS last_t
        FROM per_ts GROUP BY ALL ORDER BY replica, bucket
        """,
        [origin - lookback_s, until, origin, origin, bucket_s],
    )


def _gpu_buckets(
    con: duckdb.DuckDBPyConnection,
    origin: float,
    until: float,
    bucket_s: float,
    busy_util: float,
) -> pd.DataFrame:
    return _frame(
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


def build_context(
    con: duckdb.DuckDBPyConnection,
    since: float,
    until: float,
    options: DiagnoseOptions,
    *,
    data_start: float | None,
) -> DiagnoseContext:
    """Bucket the window (and its baseline) once; ``data_start`` is the store's oldest time."""
    o = options
    span = max(until - since, o.bucket_s)
    history_from = max(
        since - o.baseline_lookback_s, data_start if data_start is not None else since
    )
    if since - history_from >= o.min_baseline_buckets * o.bucket_s:
        # Whole buckets of history, so that ``since`` falls on a bucket boundary.
        k = math.floor((since - history_from) / o.bucket_s)
        base_since, base_until, detect_since = since - k * o.bucket_s, since, since
        source = "history"
    else:
        cut = max(o.min_baseline_buckets * o.bucket_s, o.baseline_fraction * span)
        cut = math.ceil(cut / o.bucket_s) * o.bucket_s
        base_since, base_until = since, min(until, since + cut)
        detect_since, source = base_until, "window start"
    origin = base_since
    end = until + 1e-6  # the newest sample belongs to the window
    lookback = 3 * o.bucket_s
    ctx = DiagnoseContext(
        con=con,
        options=o,
        since=since,
        until=until,
        base_since=base_since,
        base_until=base_until,
        detect_since=detect_since,
        baseline_source=source,
        origin=origin,
        requests=_request_buckets(con, origin, end, o.bucket_s),
        finished=_finished_buckets(con, origin, end, o.bucket_s),
        engine=_engine_buckets(con, origin, end, o.bucket_s, lookback),
        gpu=_gpu_buckets(con, origin, end, o.bucket_s, o.busy_util_ratio),
        sources={},
    )
    ctx.sources = _sources(ctx)
    return ctx
