"""Regression against a baseline run: a seeded bootstrap of the difference per class and metric.

For each class and metric the difference current - baseline is bootstrapped (both samples
resampled with replacement, ``resamples`` times, seeded) and a regression is flagged only
when the whole confidence interval lies beyond the tolerance: attainment's interval
entirely below ``-max_attainment_drop``, a latency percentile's entirely above
``max_latency_increase_pct`` of the baseline's value. Two samples of the same distribution
do not trip it; a real shift does. Requests a load test cut at its end (``incomplete``) are
in neither sample, as in the report. The baseline is an earlier run's records or its
``slokit slo report --json``; from a report, attainment is exact (its counts are the
sample) and a latency percentile regresses when the current interval's lower end exceeds
the baseline interval's upper end plus the tolerance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slokit.analysis.gate._config import REG_METRIC, RegressionConfig
from slokit.analysis.slo import INCOMPLETE, classify, measurement, quantile, quantile_ci
from slokit.analysis.slo_spec import SloSpec


@dataclass
class Baseline:
    """An earlier run: its records (full bootstrap) or its report JSON (summary only)."""

    records: Sequence[Mapping[str, Any]] | None = None
    report: dict[str, Any] | None = None


@dataclass(frozen=True)
class Regression:
    cls: str
    metric: str
    baseline: float | None
    current: float | None
    diff_ci: tuple[float, float] | None
    tolerance: float
    regressed: bool | None  # None: not comparable (missing data)
    method: str

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "metric": self.metric,
            "baseline": self.baseline,
            "current": self.current,
            "diff_ci": list(self.diff_ci) if self.diff_ci else None,
            "tolerance": self.tolerance,
            "regressed": self.regressed,
            "method": self.method,
        }


def _judge(
    records: Sequence[Mapping[str, Any]], spec: SloSpec
) -> dict[str, list[tuple[Mapping[str, Any], str]]]:
    """Records by class name with their outcome (classified once per comparison); an
    incomplete request (cut at a load test's end) is not judged, so it is left out."""
    out: dict[str, list[tuple[Mapping[str, Any], str]]] = {}
    for r in records:
        name, outcome = classify(r, spec)
        if name is not None and outcome != INCOMPLETE:
            out.setdefault(name, []).append((r, outcome))
    return out


def _samples(judged: Sequence[tuple[Mapping[str, Any], str]], metric: str) -> list[float]:
    if metric == "attainment":
        return [1.0 if outcome == "good" else 0.0 for _, outcome in judged]
    return [
        v
        for r, _ in judged
        if r.get("status") == "ok" and (v := measurement(r, metric)) is not None
    ]


def bootstrap_diff_ci(
    current: Sequence[float],
    baseline: Sequence[float],
    q: float | None,
    *,
    confidence: float,
    resamples: int,
    seed: int,
) -> tuple[float, float]:
    """Percentile-bootstrap CI of stat(current) - stat(baseline); stat is the mean when
    ``q`` is None, else the (linear) q-quantile. Seeded: the same inputs give the same CI.

    Each side's bootstrap distribution is sampled exactly without materialising resamples
    where that is possible: the mean of 0/1 values (attainment) is Binomial(n, p) / n, and
    a resample's k-th order statistic is ``sorted[ceil(U_k * n) - 1]`` with ``U_k ~ Beta(k,
    n - k + 1)`` (the next one is ``U_k + (1 - U_k) * Beta(1, n - k)``), so a large run costs
    O(resamples), not O(resamples x n). Other means resample rows in chunks.
    """
    import numpy as np  # deferred: numpy is only needed when a baseline is compared

    rng = np.random.default_rng(seed)

    def stats(values: Sequence[float]) -> Any:
        x = np.sort(np.asarray(values, dtype=float))
        n = len(x)
        if q is None:
            if np.all((x == 0.0) | (x == 1.0)):
                return rng.binomial(n, float(x.mean()), size=resamples) / n
            out = []
            chunk = max(1, 2_000_000 // n)
            for start in range(0, resamples, chunk):
                k = min(chunk, resamples - start)
                out.append(x[rng.integers(0, n, size=(k, n))].mean(axis=1))
            return np.concatenate(out)
        pos = (n - 1) * q
        lo = int(np.floor(pos))
        frac = pos - lo

        def at(u: Any) -> Any:
            return x[np.clip(np.ceil(u * n).astype(np.int64) - 1, 0, n - 1)]

        u_lo = rng.beta(lo + 1, n - lo, size=resamples)
        y_lo = at(u_lo)
        if frac == 0.0 or lo + 1 >= n:
            return y_lo
        u_hi = u_lo + (1.0 - u_lo) * rng.beta(1, n - lo - 1, size=resamples)
        return y_lo + frac * (at(u_hi) - y_lo)

    d = stats(current) - stats(baseline)
    alpha = (1 - confidence) / 2
    lo_ci, hi_ci = np.quantile(d, [alpha, 1 - alpha])
    return float(lo_ci), float(hi_ci)


def compare_baseline(
    current: Sequence[Mapping[str, Any]],
    baseline: Baseline,
    spec: SloSpec,
    cfg: RegressionConfig,
) -> list[Regression]:
    """One :class:`Regression` per class and configured metric (rules in the docstring)."""
    out = []
    cur_judged = _judge(current, spec)
    base_judged = _judge(baseline.records, spec) if baseline.records is not None else {}
    for i, cls in enumerate(spec.classes):
        for j, metric_key in enumerate(cfg.metrics):
            m = REG_METRIC.match(metric_key)
            assert m is not None
            metric = m.group("metric") or "attainment"
            q = int(m.group("q")) / 100 if m.group("q") else None
            seed = cfg.seed + 1000 * i + j  # independent, reproducible streams per check
            cur = _samples(cur_judged.get(cls.name, []), metric)
            if baseline.records is not None:
                base = _samples(base_judged.get(cls.name, []), metric)
                out.append(_compare_samples(cls.name, metric_key, cur, base, q, cfg, seed))
            else:
                assert baseline.report is not None
                out.append(
                    _compare_report(
                        cls.name, metric_key, metric, q, cur, baseline.report, cfg, seed
                    )
                )
    return out


def _stat(x: Sequence[float], q: float | None) -> float:
    return sum(x) / len(x) if q is None else quantile(sorted(x), q)


def _compare_samples(
    cls: str,
    key: str,
    cur: Sequence[float],
    base: Sequence[float],
    q: float | None,
    cfg: RegressionConfig,
    seed: int,
) -> Regression:
    attainment = key == "attainment"
    if not cur or not base:
        return Regression(
            cls,
            key,
            _stat(base, q) if base else None,
            _stat(cur, q) if cur else None,
            None,
            0.0,
            None,
            "not comparable: no samples on one side",
        )
    b, c = _stat(base, q), _stat(cur, q)
    lo, hi = bootstrap_diff_ci(
        cur, base, q, confidence=cfg.confidence, resamples=cfg.resamples, seed=seed
    )
    if attainment:
        tol = cfg.max_attainment_drop
        regressed = hi < -tol
    else:
        tol = b * cfg.max_latency_increase_pct / 100
        regressed = lo > tol
    method = f"bootstrap {cfg.resamples}x, {cfg.confidence:.0%} CI, seed {seed}"
    return Regression(cls, key, b, c, (lo, hi), tol, regressed, method)


#: A baseline report's class is compared as at most this many requests, its share good kept
#: (wider intervals than its real count would give: a conservative comparison).
MAX_REPORT_SAMPLES = 1_000_000


def _compare_report(
    cls: str,
    key: str,
    metric: str,
    q: float | None,
    cur: Sequence[float],
    report: dict[str, Any],
    cfg: RegressionConfig,
    seed: int,
) -> Regression:
    group = next((g for g in report.get("classes", []) if g.get("name") == cls), None)
    if group is None or not cur:
        return Regression(
            cls,
            key,
            None,
            _stat(cur, q) if cur else None,
            None,
            0.0,
            None,
            "not comparable: class missing on one side",
        )
    if metric == "attainment":
        n, good = int(group.get("requests") or 0), int((group.get("outcomes") or {}).get("good", 0))
        if n == 0:
            return Regression(
                cls,
                key,
                None,
                _stat(cur, q),
                None,
                0.0,
                None,
                "not comparable: no baseline requests",
            )
        if n > MAX_REPORT_SAMPLES:  # the same share good, in memory that a report cannot size
            good, n = round(good * MAX_REPORT_SAMPLES / n), MAX_REPORT_SAMPLES
        base = [1.0] * good + [0.0] * (n - good)
        return _compare_samples(cls, key, cur, base, None, cfg, seed)
    pct = ((group.get("percentiles") or {}).get(metric) or {}).get(f"p{round((q or 0) * 100)}")
    if not pct or pct.get("value_s") is None:
        return Regression(
            cls,
            key,
            None,
            _stat(cur, q),
            None,
            0.0,
            None,
            "not comparable: baseline report lacks it",
        )
    b = float(pct["value_s"])
    b_hi = pct.get("ci95_s", [None, None])[1]
    srt = sorted(cur)
    c = quantile(srt, q or 0.5)
    c_lo, _ = quantile_ci(srt, q or 0.5)
    tol = b * cfg.max_latency_increase_pct / 100
    if b_hi is None or c_lo is None:
        return Regression(cls, key, b, c, None, tol, None, "not comparable: too few samples")
    regressed = c_lo > float(b_hi) + tol
    return Regression(
        cls,
        key,
        b,
        c,
        (c_lo - float(b_hi), c - b),
        tol,
        regressed,
        "order-statistic 95% CIs of both runs do not overlap",
    )
