"""The CI gate: check a run's SLO report against the spec's ``gate`` section and a baseline.

The ``gate`` section of the SLO spec (every key optional)::

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

Regression: for each class and metric, the difference current - baseline is bootstrapped
(both samples resampled with replacement, ``resamples`` times, seeded) and a regression is
flagged only when the whole confidence interval lies beyond the tolerance: attainment's
interval entirely below ``-max_attainment_drop``, a latency percentile's entirely above
``max_latency_increase_pct`` of the baseline's value. Two samples of the same distribution
do not trip it; a real shift does. The baseline is an earlier run's records or its
``slokit slo report --json``; from a report, attainment is exact (its counts are the
sample) and a latency percentile regresses when the current interval's lower end exceeds
the baseline interval's upper end plus the tolerance.

Outputs: JUnit XML (one test case per class and check; a class with no requests is a
skipped case) and a Markdown summary for a CI job summary.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slokit.analysis.slo import SloReport, classify, measurement, quantile
from slokit.analysis.slo_spec import SloSpec
from slokit.errors import BadInput

_PCT_KEY = re.compile(r"^(?P<metric>ttft|tpot|itl|e2e)_p(?P<q>50|95|99)_ms$")
_REG_METRIC = re.compile(r"^(?:attainment|(?P<metric>ttft|tpot|itl|e2e)_p(?P<q>50|95|99))$")
#: Comparisons forgive float rounding: (1 - 0.6) / (1 - 0.9) is 4.000000000000001.
_EPS = 1e-9
_GATE_KEYS = {"min_attainment", "max_burn_rate", "min_requests", "percentiles", "regression"}
_REG_KEYS = {
    "metrics", "confidence", "resamples", "seed", "max_attainment_drop",
    "max_latency_increase_pct",
}  # fmt: skip


# --- config ---------------------------------------------------------------------------------


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
            raise _fail(spec, node, path, f"must be a number {rng}, got {v!r}")
        out[name] = float(v)
    return out


def _regression(spec: SloSpec, raw: Any) -> RegressionConfig:
    if raw is None:
        return RegressionConfig()
    if not isinstance(raw, dict):
        raise _fail(spec, spec.gate, "gate.regression", "must be a mapping")
    unknown = set(raw) - _REG_KEYS - {"__line__"}
    if unknown:
        raise _fail(spec, raw, "gate.regression", f"unknown keys {sorted(unknown)}")
    cfg = RegressionConfig()
    metrics = raw.get("metrics", list(cfg.metrics))
    if (
        not isinstance(metrics, list)
        or not metrics
        or not all(isinstance(m, str) and _REG_METRIC.match(m) for m in metrics)
    ):
        raise _fail(
            spec,
            raw,
            "gate.regression.metrics",
            f"a list of attainment or <ttft|tpot|itl|e2e>_p<50|95|99>, got {metrics!r}",
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
            raise _fail(spec, raw, f"gate.regression.{key}", f"must be {kind} {rng}, got {v!r}")
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


def gate_config(spec: SloSpec) -> GateConfig:
    """Validate the spec's ``gate`` section (errors name the field and line)."""
    gate = spec.gate
    unknown = set(gate) - _GATE_KEYS - {"__line__"}
    if unknown:
        raise _fail(
            spec, gate, "gate", f"unknown keys {sorted(unknown)}; one of {sorted(_GATE_KEYS)}"
        )
    min_att = _per_class(spec, gate, "min_attainment", 0, 1) if "min_attainment" in gate else {}
    max_burn = _per_class(spec, gate, "max_burn_rate", 0, None) if "max_burn_rate" in gate else {}
    if "min_attainment" not in gate and "max_burn_rate" not in gate:
        min_att = {c.name: c.objective for c in spec.classes}
    min_req: dict[str, int] = {}
    if "min_requests" in gate:
        for name, v in _per_class(spec, gate, "min_requests", 0, None).items():
            if not v.is_integer():
                raise _fail(spec, gate, "gate.min_requests", f"must be an integer, got {v!r}")
            min_req[name] = int(v)
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
            if not _PCT_KEY.match(str(k)):
                raise _fail(spec, bounds, path, "expected <ttft|tpot|itl|e2e>_p<50|95|99>_ms")
            if not _is_number(v) or v <= 0:
                raise _fail(spec, bounds, path, f"must be a number > 0, got {v!r}")
            percentiles[cname][str(k)] = float(v)
    return GateConfig(
        min_attainment=min_att,
        max_burn_rate=max_burn,
        min_requests=min_req,
        percentiles=percentiles,
        regression=_regression(spec, gate.get("regression")),
    )


# --- checks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One test case: a class and one bound. ``passed`` None means skipped."""

    cls: str
    name: str
    passed: bool | None
    message: str
    kind: str = "slo"  # "slo" | "percentile" | "volume" | "regression"

    @property
    def failed(self) -> bool:
        return self.passed is False


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


@dataclass
class GateResult:
    service: str
    report: SloReport
    checks: list[Check]
    regressions: list[Regression] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "passed": self.passed,
            "checks": [
                {
                    "class": c.cls,
                    "check": c.name,
                    "kind": c.kind,
                    "result": {True: "pass", False: "fail", None: "skipped"}[c.passed],
                    "message": c.message,
                }
                for c in self.checks
            ],
            "regressions": [r.to_json() for r in self.regressions],
            "report": self.report.to_json(),
        }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.2f}%"


def evaluate_gate(
    report: SloReport,
    spec: SloSpec,
    *,
    config: GateConfig | None = None,
    current_records: Sequence[Mapping[str, Any]] | None = None,
    baseline: Baseline | None = None,
) -> GateResult:
    """Check every class against the gate; with a baseline, add regression checks."""
    cfg = config or gate_config(spec)
    if report.overall.requests == 0:
        if report.unclassified:
            names = ", ".join(c.name for c in spec.classes)
            raise BadInput(
                f"none of the {report.unclassified} requests matched an SLO class "
                f"({names}): nothing to gate on; add a class without match"
            )
        raise BadInput("no requests in the input: nothing to gate on")
    checks: list[Check] = []
    for g in report.classes:
        need = cfg.min_requests.get(g.name, 0)
        if need:
            checks.append(
                Check(
                    g.name,
                    f"requests >= {need}",
                    g.requests >= need,
                    f"{g.requests} requests",
                    "volume",
                )
            )
        if g.requests == 0:
            checks.append(Check(g.name, "attainment", None, "no requests of this class"))
            continue
        if g.name in cfg.min_attainment:
            lim = cfg.min_attainment[g.name]
            att = g.attainment or 0.0
            ok = att >= lim - _EPS
            checks.append(
                Check(
                    g.name,
                    f"attainment >= {lim:g}",
                    ok,
                    f"attainment {_pct(att)} ({g.good}/{g.requests} good) "
                    f"{'>=' if ok else '<'} {_pct(lim)}",
                )
            )
        if g.name in cfg.max_burn_rate:
            lim = cfg.max_burn_rate[g.name]
            br = g.burn_rate or 0.0
            ok = br <= lim * (1 + _EPS)
            checks.append(
                Check(
                    g.name,
                    f"burn_rate <= {lim:g}",
                    ok,
                    f"burn rate {br:.2f} {'<=' if ok else '>'} {lim:g}",
                )
            )
        for key, bound_ms in cfg.percentiles.get(g.name, {}).items():
            m = _PCT_KEY.match(key)
            assert m is not None
            p = g.percentile(m.group("metric"), int(m.group("q")) / 100)
            if p is None:
                checks.append(
                    Check(
                        g.name,
                        f"{key} <= {bound_ms:g}",
                        False,
                        f"{m.group('metric')} was not measured",
                        "percentile",
                    )
                )
                continue
            v = p.value_s * 1000
            ok = v <= bound_ms
            checks.append(
                Check(
                    g.name,
                    f"{key} <= {bound_ms:g}",
                    ok,
                    f"{key} {v:.1f} ms {'<=' if ok else '>'} {bound_ms:g} ms",
                    "percentile",
                )
            )
    result = GateResult(spec.service, report, checks)
    if baseline is not None:
        if current_records is None:
            raise ValueError("a baseline comparison needs the current records")
        result.regressions = compare_baseline(current_records, baseline, spec, cfg.regression)
        for r in result.regressions:
            ci = (
                f"[{_fmt_metric(r.metric, r.diff_ci[0])}, {_fmt_metric(r.metric, r.diff_ci[1])}]"
                if r.diff_ci
                else "n/a"
            )
            msg = (
                f"{r.metric}: baseline {_fmt_metric(r.metric, r.baseline)}, current "
                f"{_fmt_metric(r.metric, r.current)}, difference CI {ci} ({r.method})"
            )
            passed = None if r.regressed is None else not r.regressed
            checks.append(Check(r.cls, f"no regression in {r.metric}", passed, msg, "regression"))
    return result


def _fmt_metric(metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    return _pct(v) if metric == "attainment" else f"{v * 1000:.1f} ms"


# --- baseline -------------------------------------------------------------------------------


@dataclass
class Baseline:
    """An earlier run: its records (full bootstrap) or its report JSON (summary only)."""

    records: Sequence[Mapping[str, Any]] | None = None
    report: dict[str, Any] | None = None


def _judge(
    records: Sequence[Mapping[str, Any]], spec: SloSpec
) -> dict[str, list[tuple[Mapping[str, Any], str]]]:
    """Records by class name with their outcome (classified once per comparison)."""
    out: dict[str, list[tuple[Mapping[str, Any], str]]] = {}
    for r in records:
        name, outcome = classify(r, spec)
        if name is not None:
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
    import numpy as np

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
            m = _REG_METRIC.match(metric_key)
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
        base = [1.0] * good + [0.0] * (n - good)
        return _compare_samples(cls, key, cur, base, None, cfg, seed)
    pct = ((group.get("percentiles") or {}).get(metric) or {}).get(f"p{round((q or 0) * 100)}")
    if not pct:
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
    from slokit.analysis.slo import quantile_ci

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


# --- outputs --------------------------------------------------------------------------------


def junit_xml(result: GateResult) -> str:
    """JUnit XML: one testsuite per gate run, one testcase per class and check."""
    checks = result.checks
    failures = sum(c.failed for c in checks)
    skipped = sum(c.passed is None for c in checks)
    root = ET.Element(
        "testsuites",
        name="slokit gate",
        tests=str(len(checks)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
    )
    suite = ET.SubElement(
        root,
        "testsuite",
        name=f"slo.{result.service}",
        tests=str(len(checks)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time="0",
    )
    for c in checks:
        case = ET.SubElement(
            suite, "testcase", classname=f"slo.{result.service}.{c.cls}", name=c.name, time="0"
        )
        if c.passed is None:
            ET.SubElement(case, "skipped", message=c.message)
        elif not c.passed:
            el = ET.SubElement(case, "failure", message=c.message, type=f"{c.kind}_breach")
            el.text = c.message
        else:
            out = ET.SubElement(case, "system-out")
            out.text = c.message
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _ms(report_group: Any, metric: str, q: float) -> str:
    p = report_group.percentile(metric, q)
    return "-" if p is None else f"{p.value_s * 1000:.0f} ms"


def markdown_summary(result: GateResult) -> str:
    """A Markdown summary for a CI job summary ($GITHUB_STEP_SUMMARY)."""
    rep = result.report
    failed = [c for c in result.checks if c.failed]
    verdict = "PASS" if result.passed else "FAIL"
    head = f"## slokit gate: {verdict}" + (
        f" ({len(failed)} of {len(result.checks)} checks breached)"
        if failed
        else f" ({len(result.checks)} checks)"
    )
    dur = rep.window.duration_s
    lines = [
        head,
        "",
        f"Service `{result.service}`: {rep.overall.requests} requests"
        + (f" over {dur:.1f} s" if dur else "")
        + (f", {rep.unclassified} matched no class" if rep.unclassified else "")
        + ".",
        "",
        "| class | requests | good | attainment | objective | burn rate | good req/s "
        "| TTFT p95 | TPOT p95 | E2E p95 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in rep.classes:
        br = "-" if g.burn_rate is None else f"{g.burn_rate:.2f}"
        gr = "-" if g.good_rps is None else f"{g.good_rps:.3f}"
        lines.append(
            f"| {g.name} | {g.requests} | {g.good} | {_pct(g.attainment)} | {_pct(g.objective)} "
            f"| {br} | {gr} | {_ms(g, 'ttft', 0.95)} | {_ms(g, 'tpot', 0.95)} "
            f"| {_ms(g, 'e2e', 0.95)} |"
        )
    lines += ["", "### Checks", "", "| result | class | check | detail |", "|---|---|---|---|"]
    icon = {True: "pass", False: "**FAIL**", None: "skipped"}
    for c in result.checks:
        lines.append(f"| {icon[c.passed]} | {c.cls} | {c.name} | {c.message} |")
    if result.regressions:
        lines += [
            "",
            "### Compared with the baseline",
            "",
            "| class | metric | baseline | current | difference CI | regression |",
            "|---|---|---:|---:|---:|---|",
        ]
        for r in result.regressions:
            ci = (
                "-"
                if r.diff_ci is None
                else f"[{_fmt_metric(r.metric, r.diff_ci[0])}, {_fmt_metric(r.metric, r.diff_ci[1])}]"
            )
            flag = {True: "**yes**", False: "no (within noise)", None: "n/a"}[r.regressed]
            lines.append(
                f"| {r.cls} | {r.metric} | {_fmt_metric(r.metric, r.baseline)} "
                f"| {_fmt_metric(r.metric, r.current)} | {ci} | {flag} |"
            )
    return "\n".join(lines) + "\n"


# --- inputs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunInput:
    """Records of one run, merged through the store, and the run's own duration if known."""

    records: list[dict[str, Any]]
    duration_s: float | None = None


def records_from_fragments(fragments: Sequence[Any]) -> list[dict[str, Any]]:
    """Merge fragments in an in-memory store (the same path as ``ingest``) and read them."""
    from slokit.analysis.slo import load_records
    from slokit.store.db import open_store

    with open_store(":memory:") as store:
        store.append_fragments(fragments)
        return load_records(store.con)


def _bench_duration(text: str) -> float | None:
    """Sum of ``duration`` over the runs in a vLLM bench result (one or --append-result)."""
    import json

    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:
        docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    ds = [d.get("duration") for d in docs if isinstance(d, dict)]
    total = 0.0
    for d in ds:
        if not isinstance(d, int | float) or not _is_number(d) or d <= 0:
            return None
        total += float(d)
    return total or None


def load_run_file(path: str, kind: str) -> RunInput:
    """``kind`` ``vllm-bench`` (``vllm bench serve --save-detailed`` JSON), ``records``
    (``slokit load`` JSONL, or a bench file told apart by content) -> :class:`RunInput`."""
    from slokit.sources import files

    text = files.read_text(path)
    if kind == "vllm-bench" or (kind == "records" and files.is_vllm_bench(text)):
        frags = files.parse_vllm_bench(text, name=path)
        return RunInput(records_from_fragments(frags), _bench_duration(text))
    if kind != "records":
        raise ValueError(kind)
    return RunInput(records_from_fragments(files.parse_load_jsonl(text, name=path)))


def load_baseline(path: str) -> Baseline:
    """A baseline: ``slokit slo report --json`` output, or an earlier run's records file."""
    import json

    from slokit.sources import files

    text = files.read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "classes" in doc and "overall" in doc:
        if not isinstance(doc["classes"], list):
            raise BadInput(f"{path}: classes must be a list (a slokit slo report --json)")
        return Baseline(report=doc)
    return Baseline(records=load_run_file(path, "records").records)
