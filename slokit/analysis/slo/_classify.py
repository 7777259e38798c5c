"""One request judged against its SLO class: the measurements, the bounds met, the outcome."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from slokit.analysis.slo_spec import SloClass, SloSpec

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


def as_number(v: Any) -> float | None:
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
        v = as_number(record.get("client_ttft_s"))
        return v if v is not None else as_number(record.get("ttft_s"))
    if metric == "e2e":
        v = as_number(record.get("client_e2e_s"))
        return v if v is not None else as_number(record.get("e2e_s"))
    if metric == "tpot":
        return as_number(record.get("tpot_s"))
    if metric == "itl":
        return as_number(record.get("itl_p95_s"))
    raise ValueError(f"unknown latency metric {metric!r}")


def _tpot_undefined(record: Mapping[str, Any]) -> bool:
    out = as_number(record.get("output_tokens"))
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
