"""The request judged by its SLO class, with the same rules as the SLI (:mod:`slokit.analysis.slo`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slokit.analysis.explain._model import BoundCheck, SloJudgement
from slokit.analysis.slo import bound_results, classify, measurement
from slokit.analysis.slo_spec import SloSpec


def judge(rec: Mapping[str, Any], spec: SloSpec | None) -> SloJudgement | None:
    """None without a spec; otherwise the class, outcome and each bound's check."""
    if spec is None:
        return None
    name, outcome = classify(rec, spec)
    if name is None:
        return SloJudgement(None, outcome, None, reason="matches no SLO class")
    cls = spec.class_named(name)
    bounds = cls.bounds_ms()
    checks = {}
    for key, ok in bound_results(rec, cls).items():
        v = measurement(rec, key.removesuffix("_ms"))
        checks[key] = BoundCheck(bounds[key], None if v is None else round(v * 1000, 3), ok)
    return SloJudgement(name, outcome, outcome == "good", objective=cls.objective, checks=checks)
