"""Impact of a finding: the requests it affected in the window, and the severity that follows.

A rule measures the size of its signal (a TTFT ratio, a clock drop, a count of preemptions);
how much it matters is the share of requests it touched. Each rule counts the requests it
affected in its episode (slow, preempted or failed, with the helpers below) and hands them to
:func:`slokit.analysis.rules._util.make_finding`, which calls :func:`assess`: the share is
taken of the requests the window holds in the finding's scope (its replica, or the fleet),
the severity is capped by it (``DiagnoseOptions.impact_info_below`` and
``impact_warning_below``: a small share never pages anyone; a severity is never raised),
and the summary says it ("affected 3% of requests (5 of 167)").

Counting works at the bucket granularity of the context's frames where a per-request test
would need the records: a bucket of the episode whose TTFT p95 (or TPOT p50) crossed the
rule's limit counts all its requests as slow. Rules whose findings are not about requests
(``telemetry_gap``, ``gpu_xid``) pass no impact and keep their own severity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from slokit.records import Severity

if TYPE_CHECKING:  # the rules' context imports pandas; this module only reads it
    from slokit.analysis.rules._context import DiagnoseContext, DiagnoseOptions

__all__ = [
    "Impact",
    "assess",
    "cap_severity",
    "requests_in",
    "slow_requests",
    "window_requests",
]

_LEVELS: tuple[Severity, ...] = ("info", "warning", "critical")


@dataclass(frozen=True)
class Impact:
    """``requests`` affected out of ``total`` in the window's scope (replica or fleet)."""

    requests: int
    total: int

    @property
    def share(self) -> float:
        return min(1.0, self.requests / self.total) if self.total > 0 else 0.0

    def to_json(self) -> dict[str, int | float]:
        """The ``impact`` object of a finding in ``diagnose --json``."""
        return {"requests": self.requests, "share": round(self.share, 4)}

    def phrase(self) -> str:
        """``affected 3% of requests (17 of 574)`` for summaries."""
        pct = self.share * 100
        shown = f"{pct:.0f}%" if pct >= 1 or pct == 0 else "<1%"
        return f"affected {shown} of requests ({self.requests} of {self.total})"


def cap_severity(severity: Severity, impact: Impact | None, options: DiagnoseOptions) -> Severity:
    """``severity`` lowered to what the affected share allows (never raised)."""
    if impact is None:
        return severity
    share = impact.share
    ceiling: Severity = (
        "info"
        if share < options.impact_info_below
        else "warning"
        if share < options.impact_warning_below
        else "critical"
    )
    return severity if _LEVELS.index(severity) <= _LEVELS.index(ceiling) else ceiling


def assess(ctx: DiagnoseContext, replica: str | None, affected: float | None) -> Impact | None:
    """The impact of ``affected`` requests in ``replica``'s scope (None: not measurable)."""
    if affected is None or not ctx.has("requests"):
        return None
    total = window_requests(ctx, replica)
    if total <= 0:
        return None
    return Impact(requests=min(total, max(0, round(affected))), total=total)


def window_requests(ctx: DiagnoseContext, replica: str | None) -> int:
    """Requests arriving in the diagnosis window on ``replica`` (None: the fleet)."""
    return requests_in(ctx, replica, ctx.since, ctx.until + 1e-6)


def requests_in(ctx: DiagnoseContext, replica: str | None, start: float, end: float) -> int:
    """Requests arriving in ``[start, end)`` on ``replica`` (None: the fleet)."""
    return int(ctx.request_summary(replica, start, end)["n"] or 0)


def slow_requests(
    ctx: DiagnoseContext,
    replica: str | None,
    start: float,
    end: float,
    *,
    column: str,
    limit: float,
) -> int:
    """Requests of the buckets in ``[start, end)`` (on ``replica``, None: every replica)
    whose ``column`` (``ttft_p95``, ``tpot_p50``) reached ``limit``, plus the failed requests
    of the other buckets (a failed request is affected whatever its latency)."""
    frame = ctx.requests if replica is None else ctx.of("requests", replica)
    if frame.empty:
        return 0
    t = ctx.origin + frame["bucket"] * ctx.options.bucket_s
    rows = frame[(t >= start - 1e-9) & (t < end)]
    slow = rows[column] >= limit
    return int(rows.loc[slow, "n"].sum() + rows.loc[~slow, "n_err"].sum())
