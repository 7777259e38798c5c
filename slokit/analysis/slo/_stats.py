"""Percentiles with distribution-free confidence intervals (order statistics)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slokit.analysis.slo._classify import PERCENTILES, measurement


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
    # deferred: statistics (and fractions) load only when a CI is computed, not in the
    # sidecar, whose SLI accounting imports this package
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
