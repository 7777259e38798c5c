"""The SLO report per class and overall: attainment, burn rate, goodput, percentiles."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slokit.analysis.slo._classify import (
    BURN_WINDOWS_S,
    INCOMPLETE,
    LATENCY_METRICS,
    OUTCOMES,
    as_number,
    bound_results,
    classify,
)
from slokit.analysis.slo._stats import Percentile, latency_percentiles
from slokit.analysis.slo._sweep import MaxGoodput, max_goodput, sweep_points
from slokit.analysis.slo._window import Window, arrival, in_window, resolve_window
from slokit.analysis.slo_spec import SloClass, SloSpec
from slokit.timeutil import iso


def burn_rate(attainment: float | None, objective: float) -> float | None:
    """(1 - attainment) / (1 - objective); None without requests."""
    if attainment is None:
        return None
    return (1.0 - attainment) / (1.0 - objective)


@dataclass
class GroupReport:
    """Per class (or overall): counts, attainment, burn rate, goodput, percentiles.

    ``requests`` are the judged ones (the sum of ``outcomes``); ``incomplete`` counts the
    requests a load test cut at its end, apart from them."""

    name: str
    objective: float | None
    bounds_ms: dict[str, float]
    requests: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    incomplete: int = 0
    unmeasurable: dict[str, int] = field(default_factory=dict)
    good_output_tokens: int = 0
    output_tokens: int = 0
    duration_s: float | None = None
    percentiles: dict[str, tuple[int, list[Percentile]]] = field(default_factory=dict)
    burn_windows: dict[str, float | None] = field(default_factory=dict)

    @property
    def good(self) -> int:
        return self.outcomes["good"]

    @property
    def attainment(self) -> float | None:
        return self.good / self.requests if self.requests else None

    @property
    def burn_rate(self) -> float | None:
        return None if self.objective is None else burn_rate(self.attainment, self.objective)

    @property
    def good_rps(self) -> float | None:
        return self.good / self.duration_s if self.duration_s else None

    @property
    def good_output_tokens_per_s(self) -> float | None:
        return self.good_output_tokens / self.duration_s if self.duration_s else None

    def percentile(self, metric: str, q: float) -> Percentile | None:
        _, ps = self.percentiles.get(metric, (0, []))
        return next((p for p in ps if abs(p.q - q) < 1e-9), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "objective": self.objective,
            "good_when_ms": self.bounds_ms,
            "requests": self.requests,
            "outcomes": dict(self.outcomes),
            "incomplete": self.incomplete,
            "unmeasurable": dict(self.unmeasurable),
            "attainment": self.attainment,
            "burn_rate": self.burn_rate,
            "burn_rate_windows": dict(self.burn_windows),
            "observed_goodput": {
                "good_requests_per_s": self.good_rps,
                "good_output_tokens_per_s": self.good_output_tokens_per_s,
                "good_output_tokens": self.good_output_tokens,
            },
            "output_tokens": self.output_tokens,
            "percentiles": {
                m: {
                    "n": n,
                    **{f"p{round(p.q * 100)}": p.to_json() for p in ps},
                }
                for m, (n, ps) in self.percentiles.items()
            },
        }


@dataclass
class SloReport:
    service: str
    window: Window
    classes: list[GroupReport]
    overall: GroupReport
    unclassified: int
    max_goodput: MaxGoodput | None = None

    def class_report(self, name: str) -> GroupReport:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "window": {
                "since": iso(self.window.since),
                "until": iso(self.window.until),
                "duration_s": self.window.duration_s,
                "basis": self.window.basis,
            },
            "classes": [c.to_json() for c in self.classes],
            "overall": self.overall.to_json(),
            "unclassified_requests": self.unclassified,
            "max_goodput": self.max_goodput.to_json() if self.max_goodput else None,
        }


def _fill(
    group: GroupReport,
    recs: Sequence[Mapping[str, Any]],
    outcomes: Sequence[str],
    classes: Sequence[SloClass | None],
) -> None:
    """Count the group's judged requests; an incomplete one only in ``group.incomplete``."""
    judged = [(r, o, c) for r, o, c in zip(recs, outcomes, classes, strict=True) if o != INCOMPLETE]
    group.incomplete = len(recs) - len(judged)
    group.requests = len(judged)
    for r, outcome, cls in judged:
        group.outcomes[outcome] += 1
        tokens = int(as_number(r.get("output_tokens")) or 0)
        group.output_tokens += tokens
        if outcome == "good":
            group.good_output_tokens += tokens
        if r.get("status") == "ok":
            for key, met in bound_results(r, cls).items():
                if met is None:
                    group.unmeasurable[key] = group.unmeasurable.get(key, 0) + 1
    for metric in LATENCY_METRICS:
        n, ps = latency_percentiles([r for r, _, _ in judged], metric)
        if n:
            group.percentiles[metric] = (n, ps)


def evaluate(
    records: Iterable[Mapping[str, Any]],
    spec: SloSpec,
    *,
    since: float | None = None,
    until: float | None = None,
    duration_s: float | None = None,
    sweep: str | float | None = None,
) -> SloReport:
    """Judge records against the spec over ``[since, until)`` (all records when unbounded).

    ``duration_s`` overrides the window's length for goodput (a vLLM bench file knows its
    duration but its records carry no wall-clock times). ``sweep``: ``"run"`` or a window
    length in seconds to compute the DistServe max goodput (see :func:`sweep_points`).
    """
    recs = in_window(records, since, until)
    window = resolve_window(recs, since, until, duration_s)
    judged = [(r, classify(r, spec)) for r in recs]
    by_class: dict[str, list[tuple[Mapping[str, Any], str]]] = {c.name: [] for c in spec.classes}
    unclassified = 0
    for r, (name, outcome) in judged:
        if name is None:
            unclassified += 1
        else:
            by_class[name].append((r, outcome))
    reports = []
    classified: list[tuple[Mapping[str, Any], str, SloClass | None]] = []
    for cls in spec.classes:
        g = GroupReport(cls.name, cls.objective, cls.bounds_ms(), duration_s=window.duration_s)
        items = by_class[cls.name]
        _fill(g, [r for r, _ in items], [o for _, o in items], [cls] * len(items))
        g.burn_windows = _burn_windows([(arrival(r), o) for r, o in items], cls, window)
        reports.append(g)
        classified += [(r, o, cls) for r, o in items]
    overall = GroupReport("overall", None, {}, duration_s=window.duration_s)
    _fill(
        overall,
        [r for r, _, _ in classified],
        [o for _, o, _ in classified],
        [c for _, _, c in classified],
    )
    report = SloReport(spec.service, window, reports, overall, unclassified)
    if sweep is not None:
        report.max_goodput = max_goodput(sweep_points(recs, spec, by=sweep))
    return report


def _burn_windows(
    judged: Sequence[tuple[float | None, str]], cls: SloClass, window: Window
) -> dict[str, float | None]:
    """Burn rate over each SRE window ending at the window's end that the data spans."""
    if window.until is None or window.duration_s is None:
        return {}
    out: dict[str, float | None] = {}
    for w in BURN_WINDOWS_S:
        if w > window.duration_s:
            break
        start = window.until - w
        sub = [
            o for a, o in judged if a is not None and start <= a <= window.until and o != INCOMPLETE
        ]
        good = sum(1 for o in sub if o == "good")
        out[fmt_window(w)] = burn_rate(good / len(sub), cls.objective) if sub else None
    return out


def fmt_window(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
