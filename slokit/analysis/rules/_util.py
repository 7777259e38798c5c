"""Small helpers shared by the rules: number formatting, episodes, finding construction."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from slokit.analysis.impact import Impact, cap_severity
from slokit.analysis.rules import runbook_path
from slokit.analysis.rules._context import DiagnoseContext, DiagnoseOptions
from slokit.records import Finding, Severity
from slokit.timeutil import iso

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def fmt_s(v: float | None) -> str:
    """Seconds for people: ``310 ms``, ``4.1 s``."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "?"
    if v < 1:
        return f"{v * 1000:.0f} ms" if v >= 0.01 else f"{v * 1000:.1f} ms"
    return f"{v:.1f} s"


def fmt_x(v: float | None) -> str:
    if v is None or math.isnan(v) or math.isinf(v):
        return "?x"
    return f"{v:.1f}x" if v < 100 else f"{v:.0f}x"


def fmt_pct(v: float | None, digits: int = 0) -> str:
    if v is None or math.isnan(v):
        return "?%"
    return f"{v * 100:.{digits}f}%"


def num(v: Any) -> float | None:
    """A finite float or None (NaN, NA, None and infinities become None)."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def ratio(a: Any, b: Any) -> float | None:
    """``a / b`` or None when either is unknown or ``b`` is not positive."""
    fa, fb = num(a), num(b)
    if fa is None or fb is None or fb <= 0:
        return None
    return fa / fb


def rnd(v: Any, digits: int = 4) -> float | None:
    f = num(v)
    return None if f is None else round(f, digits)


def whole(v: Any) -> int | None:
    """``v`` rounded to an int, or None when it is not a finite number."""
    f = num(v)
    return None if f is None else round(f)


def items(values: Any) -> list[Any]:
    """The elements of a list column's cell (a numpy array, a list, or None/NA)."""
    if values is None or isinstance(values, float):
        return []
    return list(values)


def clamp01(v: float) -> float:
    return max(0.0, min(1.0, v))


def replicas_of(frame: pd.DataFrame) -> list[str]:
    if frame.empty:
        return []
    return sorted(str(r) for r in frame["replica"].unique())


def rows_of(frame: pd.DataFrame, replica: str) -> pd.DataFrame:
    return frame[frame["replica"] == replica]


def episode(ctx: DiagnoseContext, flagged: pd.DataFrame) -> tuple[float, float] | None:
    """[start of the first flagged bucket, end of the last] or None when nothing is flagged."""
    if flagged.empty:
        return None
    return ctx.bucket_start(int(flagged["bucket"].min())), ctx.bucket_end(
        int(flagged["bucket"].max())
    )


def in_span(ctx: DiagnoseContext, frame: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    t = ctx.origin + frame["bucket"] * ctx.options.bucket_s
    return frame[(t >= start - 1e-9) & (t < end)]


def series(ctx: DiagnoseContext, frame: pd.DataFrame, column: str, limit: int = 60) -> list[Any]:
    """``[[iso time, value], ...]`` of one bucketed column, thinned to ``limit`` points."""
    rows = frame[["bucket", column]].dropna()
    if len(rows) > limit:
        step = math.ceil(len(rows) / limit)
        rows = rows.iloc[::step]
    return [
        [iso(ctx.bucket_start(int(b))), rnd(v)]
        for b, v in zip(rows["bucket"], rows[column], strict=True)
    ]


def window_json(start: float, end: float) -> dict[str, Any]:
    return {"start": iso(start), "end": iso(end)}


def make_finding(
    rule: str,
    *,
    severity: Severity,
    confidence: float,
    replica: str | None,
    start: float,
    end: float,
    summary: str,
    evidence: dict[str, Any],
    impact: Impact | None = None,
    options: DiagnoseOptions | None = None,
) -> Finding:
    """A finding; with ``impact`` (the requests it affected) its severity is capped by the
    affected share (``options``' thresholds), and the summary and the finding say it."""
    if impact is not None:
        severity = cap_severity(severity, impact, options or DiagnoseOptions())
        summary = f"{summary}; {impact.phrase()}"
    finding = Finding(
        rule=rule,
        severity=severity,
        confidence=round(clamp01(confidence), 3),
        replica=replica or None,
        start_ts=start,
        end_ts=end,
        summary=summary,
        evidence=evidence,
        runbook=runbook_path(rule),
    )
    if impact is not None:
        finding.impact = impact.to_json()
    return finding


def on(replica: str | None) -> str:
    """`` on pod-b`` or `` (fleet)`` for summaries."""
    return f" on {replica}" if replica else " across the fleet"
