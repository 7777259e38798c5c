"""The gate's checks: each SLO class against the configured bounds, plus baseline regressions.

With neither ``min_attainment`` nor ``max_burn_rate``, each class must reach its own
objective (burn rate at most 1). A class with no requests is a skipped check unless
``min_requests`` asks for some. Requests are the judged ones: a request a load test cut at
its end (``incomplete``) is in none of the checks, as in the report. Percentile bounds are
checked on point estimates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slokit.analysis.gate._config import PCT_KEY, GateConfig, gate_config
from slokit.analysis.gate._format import fmt_metric, pct
from slokit.analysis.gate._regression import Baseline, Regression, compare_baseline
from slokit.analysis.slo import GroupReport, SloReport
from slokit.analysis.slo_spec import SloSpec
from slokit.errors import BadInput

#: Comparisons forgive float rounding: (1 - 0.6) / (1 - 0.9) is 4.000000000000001.
_EPS = 1e-9


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
class RootCause:
    """A root cause of a breach: a root-cause finding of the diagnosis over the run's
    window, with the causal chain from it (``chain``: None when it explains nothing)."""

    id: str
    rule: str
    replica: str | None
    summary: str
    runbook: str
    chain: str | None = None

    @property
    def label(self) -> str:
        """``queue_saturation on pod-a`` (``on fleet`` for a fleet-wide finding)."""
        return f"{self.rule} on {self.replica or 'fleet'}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "replica": self.replica,
            "summary": self.summary,
            "runbook": self.runbook,
            "chain": self.chain,
        }


@dataclass
class GateResult:
    service: str
    report: SloReport
    checks: list[Check]
    regressions: list[Regression] = field(default_factory=list)
    #: Why it failed: the root causes of the diagnosis over the run's window, when the gate
    #: failed and its source holds the run's telemetry (a store); empty otherwise.
    root_causes: list[RootCause] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict[str, Any]:
        """The ``slokit gate --json`` document."""
        return self.to_json()

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
            "root_causes": [r.to_json() for r in self.root_causes],
            "report": self.report.to_json(),
        }


def _class_checks(g: GroupReport, cfg: GateConfig) -> list[Check]:
    """The checks of one class: volume, attainment, burn rate, percentile bounds."""
    checks: list[Check] = []
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
        return checks
    if g.name in cfg.min_attainment:
        lim = cfg.min_attainment[g.name]
        att = g.attainment or 0.0
        ok = att >= lim - _EPS
        checks.append(
            Check(
                g.name,
                f"attainment >= {lim:g}",
                ok,
                f"attainment {pct(att)} ({g.good}/{g.requests} good) "
                f"{'>=' if ok else '<'} {pct(lim)}",
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
        m = PCT_KEY.match(key)
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
    return checks


def _regression_check(r: Regression) -> Check:
    ci = (
        f"[{fmt_metric(r.metric, r.diff_ci[0])}, {fmt_metric(r.metric, r.diff_ci[1])}]"
        if r.diff_ci
        else "n/a"
    )
    msg = (
        f"{r.metric}: baseline {fmt_metric(r.metric, r.baseline)}, current "
        f"{fmt_metric(r.metric, r.current)}, difference CI {ci} ({r.method})"
    )
    passed = None if r.regressed is None else not r.regressed
    return Check(r.cls, f"no regression in {r.metric}", passed, msg, "regression")


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
        if report.overall.incomplete:
            raise BadInput(
                f"all {report.overall.incomplete} requests are incomplete (cut at the load "
                "test's end, not judged): nothing to gate on; give the run a longer --drain"
            )
        raise BadInput("no requests in the input: nothing to gate on")
    checks = [c for g in report.classes for c in _class_checks(g, cfg)]
    result = GateResult(spec.service, report, checks)
    if baseline is not None:
        if current_records is None:
            raise ValueError("a baseline comparison needs the current records")
        result.regressions = compare_baseline(current_records, baseline, spec, cfg.regression)
        checks.extend(_regression_check(r) for r in result.regressions)
    return result
