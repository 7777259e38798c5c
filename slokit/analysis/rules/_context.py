"""The data every rule reads: one window of the store, bucketed once, plus its baseline.

:func:`build_context` asks the reader for a handful of set-wise frames and hands the rules pandas
DataFrames keyed by ``(replica, bucket)``:

``requests``  by arrival bucket: counts, errors, TTFT/TPOT/E2E percentiles, mean queue,
              prefill and frontend time (TTFT not spent in the engine), prompt length.
``finished``  completions by finish bucket (throughput).
``engine``    vLLM gauges (running, waiting, KV usage) averaged and peaked per bucket, and
              counter increases per bucket with reset handling (a decrease is a reset, the
              increase across it is the new value), plus the number of resets.
``gpu``       GPU utilisation, SM clock (median while busy), power, temperature, last XID.
``router``    the gateway router (llm-d router / Inference Extension EPP): its flow-control
              queue, the pool saturation it gates on, the pool averages it reports, request
              and error increases (empty when the reader has no router series).

The **baseline** is what "normal" means for the relative rules: the data just before the
window when there is enough of it (the replica's own recent history), otherwise the first
part of the window (an earlier, hopefully quiet, period). Relative rules look for change
after the baseline (``detect_since``); rules about physical limits look at the whole window.

Rows with no replica (client-only records) are grouped under the replica ``""``; rules
report them as the fleet (``replica=None``). The frames come from a
:class:`slokit.store.reader.Reader` (implausible stored values read as missing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from slokit.store.reader import Reader, RouterReader
from slokit.timeutil import iso

#: Sources a rule may need. ``spans`` means requests carrying vLLM's own timing split
#: (queue/prefill/decode from the ``llm_request`` span), not just client timings.
SOURCES: tuple[str, ...] = ("requests", "spans", "engine", "gpu")
#: Sources only some deployments have: ``router`` (a gateway router scraped in front of the
#: engines). Their absence is no telemetry gap (``telemetry_gap`` checks :data:`SOURCES`):
#: a rule that needs one finds it does not apply; coverage lists one only when present.
OPTIONAL_SOURCES: tuple[str, ...] = ("router",)


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
    # Severity from impact (slokit.analysis.impact): a finding that affected less than this
    # share of the window's requests (on its replica, or the fleet) is at most info...
    impact_info_below: float = 0.05
    impact_warning_below: float = 0.15  # ...and less than this, at most a warning


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
        return {
            "present": self.present,
            "rows": self.rows,
            "replicas": self.replicas,
            "first": iso(self.first_ts),
            "last": iso(self.last_ts),
        }


@dataclass
class DiagnoseContext:
    reader: Reader
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
    router: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: dict[str, list[str]] = field(default_factory=dict)
    withheld: dict[str, str] = field(default_factory=dict)  # rule id -> why (set by diagnose)
    cache: dict[str, Any] = field(default_factory=dict)  # results shared between rules
    _summary_cache: dict[tuple[str, float, float], dict[str, Any]] = field(default_factory=dict)

    # -- helpers for rules -----------------------------------------------------------------
    def note(self, rule: str, text: str) -> None:
        """Say in the coverage why a rule could not judge something."""
        self.notes.setdefault(rule, []).append(text)

    def has(self, source: str) -> bool:
        info = self.sources.get(source)
        return info is not None and info.present

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
            self._summary_cache[key] = self.reader.request_summary(replica, since, until)
        return self._summary_cache[key]

    def baseline_summary(self, replica: str | None) -> dict[str, Any]:
        """The baseline's request statistics (all replicas summarised in one query)."""
        if replica is None:
            return self.request_summary(None, self.base_since, self.base_until)
        if "_baseline" not in self.cache:
            self.cache["_baseline"] = self.reader.request_summaries(
                self.base_since, self.base_until
            )
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


def _sources(ctx: DiagnoseContext) -> dict[str, SourceInfo]:
    """What each source holds inside the window, read off the bucketed frames."""
    out: dict[str, SourceInfo] = {}
    for name, frame, count in (
        ("requests", ctx.requests, "n"),
        ("spans", ctx.requests, "n_timed"),
        ("engine", ctx.engine, "samples"),
        ("gpu", ctx.gpu, "samples"),
        ("router", ctx.router, "samples"),
    ):
        if name in OPTIONAL_SOURCES and frame.empty:
            continue
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


def build_context(
    reader: Reader,
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
        reader=reader,
        options=o,
        since=since,
        until=until,
        base_since=base_since,
        base_until=base_until,
        detect_since=detect_since,
        baseline_source=source,
        origin=origin,
        requests=reader.request_buckets(origin, end, o.bucket_s),
        finished=reader.finished_buckets(origin, end, o.bucket_s),
        engine=reader.engine_buckets(origin, end, o.bucket_s, lookback),
        gpu=reader.gpu_buckets(origin, end, o.bucket_s, o.busy_util_ratio),
        sources={},
        router=(
            reader.router_buckets(origin, end, o.bucket_s)
            if isinstance(reader, RouterReader)
            else pd.DataFrame()
        ),
    )
    ctx.sources = _sources(ctx)
    return ctx
