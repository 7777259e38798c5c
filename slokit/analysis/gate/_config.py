"""The ``gate`` section of an SLO spec: validation into a :class:`GateConfig`.

The section (every key optional)::

    gate:
      min_attainment: 0.99              # a number for every class, or {class: number}
      max_burn_rate: 2.0                # a number for every class, or {class: number}
      min_requests: 50                  # a class with fewer requests fails; a number or
                                        #   {class: n} (default 0: a class with no requests
                                        #   is skipped)
      percentiles:                      # optional latency bounds, point estimates
        interactive: {ttft_p95_ms: 800, tpot_p99_ms: 120}
      regression:                       # used with --baseline
        metrics: [attainment, ttft_p95, tpot_p95, e2e_p95]   # the default
        confidence: 0.95                # of the bootstrap interval on the difference
        resamples: 2000
        seed: 0                         # the bootstrap is seeded: same input, same verdict
        max_attainment_drop: 0.0        # tolerated drop, absolute (0.01 = 1 point)
        max_latency_increase_pct: 5     # tolerated increase, % of the baseline's value

With neither ``min_attainment`` nor ``max_burn_rate``, each class must reach its own
objective (burn rate at most 1). Percentile keys are ``<metric>_p<50|95|99>_ms`` with metric
``ttft``, ``tpot``, ``itl`` or ``e2e`` (measured as :mod:`slokit.analysis.slo` defines them).

:func:`slokit.analysis.slo_spec.parse_spec` runs :func:`gate_config` when a spec is loaded,
so a bad gate section fails every command that reads the spec, not only ``slokit gate``;
errors name the field and the line of the offending mapping.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from slokit.analysis.slo_spec import SloSpec
from slokit.errors import BadInput, show

#: A percentile bound's key: ``<metric>_p<q>_ms``.
PCT_KEY = re.compile(r"^(?P<metric>ttft|tpot|itl|e2e)_p(?P<q>50|95|99)_ms$")
#: A regression metric: ``attainment`` or ``<metric>_p<q>``.
REG_METRIC = re.compile(r"^(?:attainment|(?P<metric>ttft|tpot|itl|e2e)_p(?P<q>50|95|99))$")
_GATE_KEYS = {"min_attainment", "max_burn_rate", "min_requests", "percentiles", "regression"}
_REG_KEYS = {
    "metrics", "confidence", "resamples", "seed", "max_attainment_drop",
    "max_latency_increase_pct",
}  # fmt: skip


@dataclass(frozen=True)
class RegressionConfig:
    metrics: tuple[str, ...] = ("attainment", "ttft_p95", "tpot_p95", "e2e_p95")
    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0
    max_attainment_drop: float = 0.0
    max_latency_increase_pct: float = 5.0


@dataclass(frozen=True)
class GateConfig:
    min_attainment: dict[str, float]
    max_burn_rate: dict[str, float]
    min_requests: dict[str, int] = field(default_factory=dict)
    percentiles: dict[str, dict[str, float]] = field(default_factory=dict)
    regression: RegressionConfig = field(default_factory=RegressionConfig)


def _fail(spec: SloSpec, node: Any, path: str, msg: str) -> BadInput:
    line = node.get("__line__") if isinstance(node, dict) else None
    where = f"{spec.source}:{line}" if line else spec.source
    return BadInput(f"{where}: {path}: {msg}")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _per_class(
    spec: SloSpec, gate: dict[str, Any], key: str, lo: float, hi: float | None
) -> dict[str, float]:
    raw = gate[key]
    names = [c.name for c in spec.classes]
    items: dict[str, Any]
    if isinstance(raw, dict):
        items = {k: v for k, v in raw.items() if k != "__line__"}
        node = raw
        for name in items:
            if name not in names:
                raise _fail(spec, raw, f"gate.{key}.{name}", f"no such class; one of {names}")
    else:
        items, node = dict.fromkeys(names, raw), gate
    out = {}
    for name, v in items.items():
        path = f"gate.{key}" + (f".{name}" if isinstance(raw, dict) else "")
        if not _is_number(v) or v < lo or (hi is not None and v > hi):
            rng = f"in [{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
            raise _fail(spec, node, path, f"must be a number {rng}, got {show(v)}")
        out[name] = float(v)
    return out


def _regression(spec: SloSpec, raw: Any) -> RegressionConfig:
    if raw is None:
        return RegressionConfig()
    if not isinstance(raw, dict):
        raise _fail(spec, spec.gate, "gate.regression", "must be a mapping")
    unknown = set(raw) - _REG_KEYS - {"__line__"}
    if unknown:
        raise _fail(spec, raw, "gate.regression", f"unknown keys {show(sorted(map(str, unknown)))}")
    cfg = RegressionConfig()
    metrics = raw.get("metrics", list(cfg.metrics))
    if (
        not isinstance(metrics, list)
        or not metrics
        or not all(isinstance(m, str) and REG_METRIC.match(m) for m in metrics)
    ):
        raise _fail(
            spec,
            raw,
            "gate.regression.metrics",
            f"a list of attainment or <ttft|tpot|itl|e2e>_p<50|95|99>, got {show(metrics)}",
        )

    def num(
        key: str, default: float, lo: float, hi: float | None, *, integer: bool = False
    ) -> float:
        v = raw.get(key, default)
        ok = _is_number(v) and v >= lo and (hi is None or v <= hi)
        if integer and ok:
            ok = float(v).is_integer()
        if not ok:
            kind = "an integer" if integer else "a number"
            rng = f"in [{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
            raise _fail(spec, raw, f"gate.regression.{key}", f"must be {kind} {rng}, got {show(v)}")
        return float(v)

    confidence = num("confidence", cfg.confidence, 0.5, 0.999)
    return RegressionConfig(
        metrics=tuple(metrics),
        confidence=confidence,
        resamples=int(num("resamples", cfg.resamples, 100, 100000, integer=True)),
        seed=int(num("seed", cfg.seed, 0, None, integer=True)),
        max_attainment_drop=num("max_attainment_drop", cfg.max_attainment_drop, 0, 1),
        max_latency_increase_pct=num(
            "max_latency_increase_pct", cfg.max_latency_increase_pct, 0, None
        ),
    )


def _percentiles(spec: SloSpec, gate: dict[str, Any]) -> dict[str, dict[str, float]]:
    pct_raw = gate.get("percentiles") or {}
    if not isinstance(pct_raw, dict):
        raise _fail(
            spec, gate, "gate.percentiles", "must map class name to {<metric>_p<q>_ms: bound}"
        )
    names = [c.name for c in spec.classes]
    percentiles: dict[str, dict[str, float]] = {}
    for cname, bounds in pct_raw.items():
        if cname == "__line__":
            continue
        if cname not in names:
            raise _fail(
                spec, pct_raw, f"gate.percentiles.{cname}", f"no such class; one of {names}"
            )
        if not isinstance(bounds, dict):
            raise _fail(spec, pct_raw, f"gate.percentiles.{cname}", "must be a mapping")
        percentiles[cname] = {}
        for k, v in bounds.items():
            if k == "__line__":
                continue
            path = f"gate.percentiles.{cname}.{k}"
            if not PCT_KEY.match(str(k)):
                raise _fail(spec, bounds, path, "expected <ttft|tpot|itl|e2e>_p<50|95|99>_ms")
            if not _is_number(v) or v <= 0:
                raise _fail(spec, bounds, path, f"must be a number > 0, got {show(v)}")
            percentiles[cname][str(k)] = float(v)
    return percentiles


def gate_config(spec: SloSpec) -> GateConfig:
    """Validate the spec's ``gate`` section (errors name the field and line)."""
    gate = spec.gate
    unknown = set(gate) - _GATE_KEYS - {"__line__"}
    if unknown:
        raise _fail(
            spec,
            gate,
            "gate",
            f"unknown keys {show(sorted(map(str, unknown)))}; one of {sorted(_GATE_KEYS)}",
        )
    min_att = _per_class(spec, gate, "min_attainment", 0, 1) if "min_attainment" in gate else {}
    max_burn = _per_class(spec, gate, "max_burn_rate", 0, None) if "max_burn_rate" in gate else {}
    if "min_attainment" not in gate and "max_burn_rate" not in gate:
        min_att = {c.name: c.objective for c in spec.classes}
    min_req: dict[str, int] = {}
    if "min_requests" in gate:
        for name, v in _per_class(spec, gate, "min_requests", 0, None).items():
            if not v.is_integer():
                raise _fail(spec, gate, "gate.min_requests", f"must be an integer, got {show(v)}")
            min_req[name] = int(v)
    percentiles = _percentiles(spec, gate)
    return GateConfig(
        min_attainment=min_att,
        max_burn_rate=max_burn,
        min_requests=min_req,
        percentiles=percentiles,
        regression=_regression(spec, gate.get("regression")),
    )
