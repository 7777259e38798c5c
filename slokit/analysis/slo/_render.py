"""The SLO report as text."""

from __future__ import annotations

from slokit.analysis.slo._classify import LATENCY_METRICS, PERCENTILES
from slokit.analysis.slo._report import SloReport
from slokit.analysis.slo._stats import Percentile
from slokit.timeutil import iso


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.2f}%"


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _ms(p: Percentile | None) -> str:
    if p is None:
        return "-"
    lo = "?" if p.ci_low_s is None else f"{p.ci_low_s * 1000:.0f}"
    hi = "?" if p.ci_high_s is None else f"{p.ci_high_s * 1000:.0f}"
    return f"{p.value_s * 1000:.0f} [{lo}-{hi}]"


def render_text(report: SloReport) -> str:
    """A human summary: one block per class, then overall and the sweep."""
    w = report.window
    lines = [
        f"SLO report for {report.service}: {iso(w.since) or '?'} .. {iso(w.until) or '?'}"
        f" ({_f(w.duration_s, '.1f')} s, {w.basis})",
    ]
    for g in [*report.classes, report.overall]:
        head = f"\n{g.name}" + (f" (objective {_pct(g.objective)})" if g.objective else "")
        lines.append(head)
        cut = (
            f"  incomplete {g.incomplete} (cut at the load test's end; not judged)"
            if g.incomplete
            else None
        )
        if not g.requests:
            lines.append("  no requests" if cut is None else "  no judged requests")
            lines += [cut] if cut else []
            continue
        o = g.outcomes
        lines.append(
            f"  requests {g.requests}: good {o['good']}  slow {o['slow']}  error {o['error']}"
            f"  quality_fail {o['quality_fail']}"
        )
        lines += [cut] if cut else []
        lines.append(f"  attainment {_pct(g.attainment)}  burn rate {_f(g.burn_rate)}")
        if g.burn_windows:
            lines.append(
                "  burn rate by window (ending at the data's end): "
                + "  ".join(f"{k} {_f(v)}" for k, v in g.burn_windows.items())
            )
        if g.unmeasurable:
            lines.append(
                "  unmeasurable (counted as not met): "
                + ", ".join(f"{k} {n}" for k, n in g.unmeasurable.items())
            )
        lines.append(
            f"  observed goodput {_f(g.good_rps, '.3f')} good req/s, "
            f"{_f(g.good_output_tokens_per_s, '.1f')} good output tokens/s"
        )
        for metric in LATENCY_METRICS:
            if metric in g.percentiles:
                n, _ = g.percentiles[metric]
                cells = "  ".join(
                    f"p{round(q * 100)} {_ms(g.percentile(metric, q))}" for q in PERCENTILES
                )
                lines.append(f"  {metric:<5} ms {cells}  (95% CI, n={n})")
    if report.unclassified:
        lines.append(f"\n{report.unclassified} requests matched no class (not counted)")
    if report.max_goodput is not None:
        mg = report.max_goodput
        bound = "" if mg.bounded else "at least "
        lines.append(
            f"\nmax goodput (DistServe, highest offered rate meeting every objective): "
            f"{bound}{_f(mg.rate_rps, '.2f')} req/s"
            + ("" if mg.bounded else " (every step met them: sweep higher to find the knee)")
        )
        for p in mg.points:
            lines.append(
                f"  step {p.label}: offered {p.offered_rps:.2f} req/s, {p.requests} requests, "
                + ("meets" if p.meets_objectives else "misses")
                + " ("
                + ", ".join(f"{k} {_pct(v)}" for k, v in p.attainment.items())
                + ")"
            )
    return "\n".join(lines)
