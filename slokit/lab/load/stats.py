"""What a load run achieved: running tallies of its records, progress snapshots, and the
end-of-run summary.

The achieved rate is the number of requests sent over the scheduled duration, or over the
time the last send actually took when that is longer: a generator that falls behind its
schedule shows a lower rate, one that keeps it shows the target. How late each open-loop
send was is ``send_ts - scheduled_ts``. Requests cut at the run's end after the drain
(``incomplete``) are counted apart: neither answered nor failed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slokit import clientlog as cl
from slokit.lab.load.config import LoadConfig


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100), ``None`` for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(slots=True)
class RunStats:
    """Counts and latency lists of a run so far; the runner updates the send fields and
    :meth:`add` takes each finished record."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    timeouts: int = 0
    cancelled: int = 0
    incomplete: int = 0
    output_tokens: int = 0
    error_types: dict[str, int] = field(default_factory=dict)  # errors by error_type
    first_send: float | None = None
    last_send: float | None = None
    last_finish: float | None = None
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)

    def add(self, rec: dict[str, Any]) -> None:
        status = rec[cl.STATUS]
        if status == "ok":
            self.ok += 1
            if rec[cl.TTFT_S] is not None:
                self.ttft.append(rec[cl.TTFT_S])
            if rec[cl.E2E_S] is not None:
                self.e2e.append(rec[cl.E2E_S])
            out = rec[cl.OUTPUT_TOKENS]
            if out and out > 1 and rec[cl.TTFT_S] is not None and rec[cl.E2E_S] is not None:
                self.tpot.append((rec[cl.E2E_S] - rec[cl.TTFT_S]) / (out - 1))
        elif status == "timeout":
            self.timeouts += 1
        elif status == "cancelled":
            self.cancelled += 1
        elif status == "incomplete":
            self.incomplete += 1
        else:
            self.errors += 1
            kind = str(rec[cl.ERROR_TYPE] or "unknown")
            self.error_types[kind] = self.error_types.get(kind, 0) + 1
        if rec[cl.OUTPUT_TOKENS]:
            self.output_tokens += rec[cl.OUTPUT_TOKENS]
        if rec[cl.FINISH_TS] is not None:
            self.last_finish = max(self.last_finish or 0.0, rec[cl.FINISH_TS])
        if rec[cl.SCHEDULED_TS] is not None:
            self.lag.append(rec[cl.SEND_TS] - rec[cl.SCHEDULED_TS])


@dataclass(slots=True)
class LoadSummary:
    """What a run achieved; the numbers the CLI prints at the end."""

    run_id: str
    mode: str  # "open" | "closed"
    target_rate: float | None
    users: int | None
    duration_s: float
    scheduled: int
    sent: int
    ok: int
    errors: int
    timeouts: int
    cancelled: int
    incomplete: int
    achieved_rate: float | None
    send_lag_p50_s: float | None
    send_lag_p99_s: float | None
    send_lag_max_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    e2e_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    output_tokens: int
    output_tokens_per_s: float | None
    out: str | None = None
    error_types: dict[str, int] = field(default_factory=dict)  # the errors by error_type

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def errors_text(self) -> str:
        """``errors 2 (http_500: 1, ServerDisconnectedError: 1)``: the count and its kinds."""
        kinds = ", ".join(f"{k}: {n}" for k, n in self.error_types.items())
        return f"errors {self.errors}" + (f" ({kinds})" if kinds else "")


@dataclass(slots=True)
class LoadResult:
    summary: LoadSummary
    records: list[dict[str, Any]]


@dataclass(slots=True)
class Progress:
    """A snapshot handed to the progress callback about once per interval."""

    elapsed_s: float
    duration_s: float
    sent: int
    ok: int
    failed: int
    in_flight: int
    ttft_p50_s: float | None


ProgressCallback = Callable[[Progress], None]


def summarize(
    stats: RunStats, cfg: LoadConfig, run_id: str, start: float, scheduled: int
) -> LoadSummary:
    """The summary of a run that started at ``start`` with ``scheduled`` requests planned."""
    s = stats
    achieved = None
    if s.sent and s.last_send is not None:
        achieved = s.sent / max(cfg.duration_s, s.last_send - start)
    out_rate = None
    if s.last_finish is not None and s.last_finish > start:
        out_rate = s.output_tokens / (s.last_finish - start)
    return LoadSummary(
        run_id=run_id,
        mode="open" if cfg.rate is not None else "closed",
        target_rate=cfg.rate,
        users=cfg.users,
        duration_s=cfg.duration_s,
        scheduled=scheduled,
        sent=s.sent,
        ok=s.ok,
        errors=s.errors,
        timeouts=s.timeouts,
        cancelled=s.cancelled,
        incomplete=s.incomplete,
        achieved_rate=achieved,
        send_lag_p50_s=percentile(s.lag, 50),
        send_lag_p99_s=percentile(s.lag, 99),
        send_lag_max_s=max(s.lag) if s.lag else None,
        ttft_p50_s=percentile(s.ttft, 50),
        ttft_p95_s=percentile(s.ttft, 95),
        ttft_p99_s=percentile(s.ttft, 99),
        e2e_p50_s=percentile(s.e2e, 50),
        e2e_p95_s=percentile(s.e2e, 95),
        e2e_p99_s=percentile(s.e2e, 99),
        tpot_p50_s=percentile(s.tpot, 50),
        tpot_p95_s=percentile(s.tpot, 95),
        output_tokens=s.output_tokens,
        output_tokens_per_s=out_rate,
        error_types=dict(sorted(s.error_types.items())),
        out=str(cfg.out) if cfg.out is not None else None,
    )
