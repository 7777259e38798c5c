"""An SLO report from counts alone: ``slokit_requests_total`` increases per class and outcome.

A backend with only aggregate series (Prometheus) cannot judge requests one by one, but the
sidecars already did: their ``slokit_requests_total{class, outcome}`` counts each judged
request once. Attainment, burn rate (over the window and each SRE window ending at its end)
and goodput follow from those counts; latency percentiles with confidence intervals need
the records and are left out (``percentiles`` is empty, and the text report says so).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from slokit.analysis.slo import (
    BURN_WINDOWS_S,
    OUTCOMES,
    GroupReport,
    SloReport,
    Window,
    burn_rate,
    fmt_window,
)
from slokit.analysis.slo_result import SloResult
from slokit.analysis.slo_spec import SloSpec

#: ``(since, until) -> class -> {outcome: requests, "output_tokens:<outcome>": tokens}``.
CountsOf = Callable[[float, float], Mapping[str, Mapping[str, float]]]

#: Said under the report: why there are no percentiles.
NO_PERCENTILES = (
    "counts from slokit_requests_total (Prometheus): attainment and burn rate only; "
    "latency percentiles need per-request records (--db, --lake or --sidecar)"
)


def _fill(group: GroupReport, counts: Mapping[str, float]) -> None:
    for outcome in OUTCOMES:
        n = round(counts.get(outcome, 0.0))
        group.outcomes[outcome] += n
        group.requests += n
        tokens = round(counts.get(f"output_tokens:{outcome}", 0.0))
        group.output_tokens += tokens
        if outcome == "good":
            group.good_output_tokens += tokens


def report_from_counts(spec: SloSpec, counts_of: CountsOf, since: float, until: float) -> SloReport:
    """The :class:`SloReport` of ``[since, until]`` from the SLI counters' increases."""
    window = Window(since, until, until - since, "window")
    counts = counts_of(since, until)
    classes = []
    overall = GroupReport("overall", None, {}, duration_s=window.duration_s)
    for cls in spec.classes:
        g = GroupReport(cls.name, cls.objective, cls.bounds_ms(), duration_s=window.duration_s)
        _fill(g, counts.get(cls.name, {}))
        _fill(overall, counts.get(cls.name, {}))
        classes.append(g)
    windows = [w for w in BURN_WINDOWS_S if w <= until - since]
    for w in windows:
        sub = counts_of(until - w, until)
        for g, cls in zip(classes, spec.classes, strict=True):
            c = sub.get(cls.name, {})
            judged = sum(c.get(o, 0.0) for o in OUTCOMES)
            att = c.get("good", 0.0) / judged if judged > 0 else None
            g.burn_windows[fmt_window(w)] = (
                burn_rate(att, cls.objective) if att is not None else None
            )
    unclassified = round(sum(counts.get("unclassified", {}).get(o, 0.0) for o in OUTCOMES))
    return SloReport(spec.service, window, classes, overall, unclassified)


def counts_result(spec: SloSpec, counts_of: CountsOf, since: float, until: float) -> SloResult:
    """The ``slo report`` result of a counts-only source: no records, no cost, and the
    document and text say that percentiles are missing and why."""
    report = report_from_counts(spec, counts_of, since, until)
    return SloResult(report, None, [], basis="counts", note=NO_PERCENTILES)
