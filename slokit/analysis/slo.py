"""SLO evaluation: classify requests, attainment, burn rate, goodput, latency percentiles.

The spec itself (YAML, ``slokit: v1``) is loaded and validated by
:mod:`slokit.analysis.slo_spec`; this module judges merged ``requests`` records against it.

Outcome of one request (:func:`classify`), first rule that applies:

``incomplete``
    ``status`` is ``incomplete``: the request was still in flight when a load test ended
    (``slokit load`` cut it after its drain, GuideLLM's ``incomplete``, AIPerf's
    ``was_cancelled``). It is neither good nor bad: it is counted apart and left out of
    attainment, burn rate, goodput and percentiles, as the load tools do. A run cut heavily
    at its end therefore reads better than it was; the report shows how many were cut.
``error``
    ``status`` is not ``ok`` (error, timeout, cancelled, rejected, or no status at all: a
    request nobody saw finish is not good).
``quality_fail``
    ``quality_pass`` is False and the spec sets ``quality.require_pass`` (a correctness
    failure outranks slowness). Unknown quality (NULL) is not a failure.
``slow``
    it finished ok but missed a ``good_when`` bound of its class. A bound whose
    measurement is missing counts as **not met** (the request could not be shown to be
    good); such requests are counted per bound as ``unmeasurable``. One exception, as in
    vLLM's ``bench serve`` goodput: TPOT is undefined for a request with at most one output
    token, and such a request meets any TPOT bound (vLLM takes its TPOT as 0).
``good``
    otherwise.

Measurements: TTFT is the client's (``client_ttft_s``) when present, else the server's
(``ttft_s``); E2E likewise (``client_e2e_s`` else ``e2e_s``); TPOT is ``tpot_s``, i.e.
``(e2e - ttft) / (output_tokens - 1)``; ITL is each request's own p95 inter-token gap
(``itl_p95_s``, the store keeps no per-token gaps), so "ITL p99" is the p99 over requests
of their p95 gap.

Attainment = good / judged requests of the class (every outcome but ``incomplete``). Burn
rate over a window = (1 - attainment) / (1 - objective): 1 spends the error budget exactly
over the SLO period, 14.4 spends 2% of a 30-day budget in an hour.

Two goodputs, never to be confused:

* **observed goodput** (``observed_goodput``): what the run delivered, good requests per
  second and output tokens of good requests per second, over the window's duration.
* **max goodput** (``max_goodput``, DistServe): from a rate sweep, the highest offered
  arrival rate at which every class still meets its objective. Sweep steps are told apart
  by run (``slokit load`` names requests ``<run-id>-<seq>``; ``--sweep`` gives each rate its
  own run id) or by fixed time windows.

Windows: a request belongs to ``[since, until)`` by its ``arrival_ts``; with no window,
all records are used and the duration is the data's own span (first arrival to last
finish), never wall-clock now.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slokit.analysis.slo_spec import SloClass, SloSpec
from slokit.errors import BadInput

OUTCOMES: tuple[str, ...] = ("good", "slow", "error", "quality_fail")
#: The outcome of a request a load test cut at its end: not judged, so not in :data:`OUTCOMES`.
INCOMPLETE = "incomplete"
#: Latency metrics whose percentiles are reported, in report order.
LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")
PERCENTILES: tuple[float, ...] = (0.50, 0.95, 0.99)
#: SRE-workbook burn-rate windows (seconds), reported where the data spans them.
BURN_WINDOWS_S: tuple[float, ...] = (300, 1800, 3600, 7200, 21600, 86400, 259200)

_BOUND_METRIC = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2e_ms": "e2e"}


# --- one request ----------------------------------------------------------------------------


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def measurement(record: Mapping[str, Any], metric: str) -> float | None:
    """The value (seconds) of ``ttft``, ``tpot``, ``itl`` or ``e2e`` for one record."""
    if metric == "ttft":
        v = _num(record.get("client_ttft_s"))
        return v if v is not None else _num(record.get("ttft_s"))
    if metric == "e2e":
        v = _num(record.get("client_e2e_s"))
        return v if v is not None else _num(record.get("e2e_s"))
    if metric == "tpot":
        return _num(record.get("tpot_s"))
    if metric == "itl":
        return _num(record.get("itl_p95_s"))
    raise ValueError(f"unknown latency metric {metric!r}")


def _tpot_undefined(record: Mapping[str, Any]) -> bool:
    out = _num(record.get("output_tokens"))
    return out is not None and out <= 1


def bound_results(record: Mapping[str, Any], cls: SloClass | None) -> dict[str, bool | None]:
    """Each ``good_when`` bound of the class -> met (True/False) or unmeasurable (None)."""
    if cls is None:
        return {}
    out: dict[str, bool | None] = {}
    for key, limit_ms in cls.bounds_ms().items():
        metric = _BOUND_METRIC[key]
        v = measurement(record, metric)
        if v is None:
            out[key] = True if metric == "tpot" and _tpot_undefined(record) else None
        else:
            out[key] = v * 1000.0 <= limit_ms
    return out


def classify(record: Mapping[str, Any], spec: SloSpec) -> tuple[str | None, str]:
    """``(class name or None, outcome)`` with outcome in :data:`OUTCOMES` or
    :data:`INCOMPLETE` (rules above)."""
    cls = spec.class_of(dict(record))
    name = cls.name if cls is not None else None
    status = record.get("status")
    if status == INCOMPLETE:
        return name, INCOMPLETE
    if status != "ok":
        return name, "error"
    if spec.require_quality_pass and record.get("quality_pass") is False:
        return name, "quality_fail"
    if any(met is not True for met in bound_results(record, cls).values()):
        return name, "slow"
    return name, "good"


#: The ``class`` label of a request that matches no class, in the SLI counters.
UNCLASSIFIED = "unclassified"


def sli_labels(record: Mapping[str, Any], spec: SloSpec) -> dict[str, str] | None:
    """Labels of ``slokit_requests_total`` for one final record (see docs/metrics.md); None
    for an incomplete request, which that counter leaves out."""
    name, outcome = classify(record, spec)
    if outcome == INCOMPLETE:
        return None
    return {
        "class": name or UNCLASSIFIED,
        "replica": str(record.get("replica") or ""),
        "model": str(record.get("model") or ""),
        "outcome": outcome,
    }


# --- statistics -----------------------------------------------------------------------------


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values (numpy's default, as vLLM reports)."""
    n = len(sorted_values)
    pos = (n - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _binom_cdf_table(n: int, q: float) -> list[float]:
    """P(B <= k) for B ~ Binomial(n, q), k = 0..n (log-space pmf, no overflow)."""
    lq, l1q = math.log(q), math.log1p(-q)
    lg = math.lgamma
    cdf, acc = [], 0.0
    for k in range(n + 1):
        acc += math.exp(lg(n + 1) - lg(k + 1) - lg(n - k + 1) + k * lq + (n - k) * l1q)
        cdf.append(min(acc, 1.0))
    return cdf


def quantile_ci(
    sorted_values: Sequence[float], q: float, confidence: float = 0.95
) -> tuple[float | None, float | None]:
    """Distribution-free confidence interval for the q-quantile from order statistics.

    The interval ``[x_(l), x_(u)]`` (1-based order statistics) covers the true quantile with
    probability ``P(l <= B < u) >= confidence``, B ~ Binomial(n, q). A side that needs an
    order statistic beyond the sample is ``None`` (too few samples to bound it).
    """
    n = len(sorted_values)
    if n == 0:
        return None, None
    alpha = (1.0 - confidence) / 2.0
    if n <= 5000:
        cdf = _binom_cdf_table(n, q)
        # l: largest with P(B <= l-1) <= alpha; u: smallest with P(B <= u-1) >= 1 - alpha.
        lo_rank = max((k + 1 for k in range(n + 1) if cdf[k] <= alpha), default=0)
        hi_rank = min((k + 1 for k in range(n + 1) if cdf[k] >= 1 - alpha), default=n + 1)
    else:  # normal approximation to the binomial
        z = 1.959963984540054 if abs(confidence - 0.95) < 1e-9 else _z(confidence)
        sd = math.sqrt(n * q * (1 - q))
        lo_rank = math.floor(n * q - z * sd)
        hi_rank = math.ceil(n * q + z * sd) + 1
    lo = sorted_values[lo_rank - 1] if 1 <= lo_rank <= n else None
    hi = sorted_values[hi_rank - 1] if 1 <= hi_rank <= n else None
    return lo, hi


def _z(confidence: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


@dataclass(frozen=True)
class Percentile:
    q: float
    value_s: float
    ci_low_s: float | None
    ci_high_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {"value_s": self.value_s, "ci95_s": [self.ci_low_s, self.ci_high_s]}


def latency_percentiles(
    records: Iterable[Mapping[str, Any]], metric: str
) -> tuple[int, list[Percentile]]:
    """p50/p95/p99 of a metric over records that finished ok, with 95% order-statistic CIs."""
    values = sorted(
        v for r in records if r.get("status") == "ok" and (v := measurement(r, metric)) is not None
    )
    if not values:
        return 0, []
    out = []
    for q in PERCENTILES:
        lo, hi = quantile_ci(values, q)
        out.append(Percentile(q, quantile(values, q), lo, hi))
    return len(values), out


# --- windows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """The evaluated span. ``duration_s`` is None when the records carry no times."""

    since: float | None
    until: float | None
    duration_s: float | None
    basis: str  # "window" | "data" | "given" | "none"


def _arrival(r: Mapping[str, Any]) -> float | None:
    return _num(r.get("arrival_ts"))


def _finish(r: Mapping[str, Any]) -> float | None:
    f = _num(r.get("finish_ts"))
    if f is not None:
        return f
    a, e = _arrival(r), measurement(r, "e2e")
    return a + e if a is not None and e is not None else a


def in_window(
    records: Iterable[Mapping[str, Any]], since: float | None, until: float | None
) -> list[Mapping[str, Any]]:
    """Records arriving in ``[since, until)``; with no bounds, all of them."""
    if since is None and until is None:
        return list(records)
    out = []
    for r in records:
        a = _arrival(r)
        if a is None:
            continue
        if since is not None and a < since:
            continue
        if until is not None and a >= until:
            continue
        out.append(r)
    return out


def resolve_window(
    records: Sequence[Mapping[str, Any]],
    since: float | None = None,
    until: float | None = None,
    duration_s: float | None = None,
) -> Window:
    """The window's duration: explicit ``duration_s``, else since..until, else the data span."""
    if duration_s is not None:
        return Window(since, until, duration_s, "given")
    arrivals = [a for r in records if (a := _arrival(r)) is not None]
    finishes = [f for r in records if (f := _finish(r)) is not None]
    lo = since if since is not None else (min(arrivals) if arrivals else None)
    hi = until if until is not None else (max(finishes) if finishes else None)
    if lo is None or hi is None or hi <= lo:
        return Window(lo, hi, None, "none")
    basis = "window" if since is not None and until is not None else "data"
    return Window(lo, hi, hi - lo, basis)


# --- reports --------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class SweepPoint:
    """One step of a rate sweep: offered rate and whether every class met its objective."""

    label: str
    offered_rps: float
    requests: int
    good: int
    attainment: dict[str, float]
    meets_objectives: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.label,
            "offered_rps": self.offered_rps,
            "requests": self.requests,
            "good": self.good,
            "attainment": self.attainment,
            "meets_objectives": self.meets_objectives,
        }


@dataclass(frozen=True)
class MaxGoodput:
    """DistServe max goodput: the highest offered rate whose step (and every slower step)
    met every class's objective. ``rate_rps`` is None when even the slowest step failed;
    ``bounded`` is False when every step met them (the true maximum lies above the fastest
    rate tried, so ``rate_rps`` is a lower bound)."""

    rate_rps: float | None
    points: tuple[SweepPoint, ...]
    bounded: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "definition": "highest offered arrival rate (req/s) at which every class's "
            "attainment stays at or above its objective (DistServe)",
            "max_goodput_rps": self.rate_rps,
            "bounded": self.bounded,
            "points": [p.to_json() for p in self.points],
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
        from slokit.timeutil import iso

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
        tokens = int(_num(r.get("output_tokens")) or 0)
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
        g.burn_windows = _burn_windows([(_arrival(r), o) for r, o in items], cls, window)
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


# --- rate sweep (DistServe max goodput) -----------------------------------------------------

_RUN_SEQ = re.compile(r"^(?P<run>.+)-(?P<seq>\d+)$")


def run_of(request_id: Any) -> str:
    """The load run of a request id ``<run-id>-<seq>`` (``-`` when it has no such shape)."""
    m = _RUN_SEQ.match(str(request_id or ""))
    return m.group("run") if m else "-"


def sweep_points(
    records: Sequence[Mapping[str, Any]], spec: SloSpec, *, by: str | float = "run"
) -> list[SweepPoint]:
    """Group records into sweep steps and judge each.

    ``by="run"``: one step per run id (request ids ``<run-id>-<seq>``); the offered rate is
    ``(n - 1) / (last arrival - first arrival)``, exact for constant spacing. ``by=<seconds>``:
    consecutive windows of that length from the first arrival; the offered rate is arrivals
    / window length (a trailing partial window is dropped).
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    rates: dict[str, float] = {}
    timed = [r for r in records if _arrival(r) is not None]
    if by == "run":
        for r in timed:
            run = run_of(r.get("request_id"))
            if run != "-":  # requests not from a load run are no sweep step
                groups.setdefault(run, []).append(r)
        for label, rs in list(groups.items()):
            ts = sorted(a for r in rs if (a := _arrival(r)) is not None)
            if len(ts) < 2 or ts[-1] <= ts[0]:
                del groups[label]
                continue
            rates[label] = (len(ts) - 1) / (ts[-1] - ts[0])
    else:
        if isinstance(by, str):
            raise BadInput(f"sweep grouping must be 'run' or a window in seconds, got {by!r}")
        width = float(by)
        if not width > 0:
            raise BadInput(f"sweep window must be > 0 s, got {width}")
        if not timed:
            return []
        t0 = min(a for r in timed if (a := _arrival(r)) is not None)
        t_end = max(a for r in timed if (a := _arrival(r)) is not None)
        full = int((t_end - t0) // width)
        for r in timed:
            a = _arrival(r)
            assert a is not None
            k = int((a - t0) // width)
            if k < full:
                groups.setdefault(f"{t0 + k * width:.0f}", []).append(r)
        for label, rs in groups.items():
            rates[label] = len(rs) / width
    points = []
    for label, rs in groups.items():
        judged = [(name, o) for name, o in (classify(r, spec) for r in rs) if o != INCOMPLETE]
        att: dict[str, float] = {}
        meets = True
        for cls in spec.classes:
            outs = [o for name, o in judged if name == cls.name]
            if outs:
                att[cls.name] = sum(o == "good" for o in outs) / len(outs)
                meets = meets and att[cls.name] >= cls.objective
        good = sum(o == "good" for _, o in judged)
        points.append(SweepPoint(label, rates[label], len(rs), good, att, meets and bool(att)))
    return sorted(points, key=lambda p: p.offered_rps)


def max_goodput(points: Sequence[SweepPoint]) -> MaxGoodput:
    """Walk the steps by offered rate; the last one before the first miss is the max."""
    best: float | None = None
    for p in sorted(points, key=lambda p: p.offered_rps):
        if not p.meets_objectives:
            return MaxGoodput(best, tuple(points), bounded=True)
        best = p.offered_rps
    return MaxGoodput(best, tuple(points), bounded=not points)


# --- text -----------------------------------------------------------------------------------


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
    from slokit.timeutil import iso

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
