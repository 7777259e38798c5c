"""The CI gate: check a run's SLO report against the spec's ``gate`` section and a baseline.

- :mod:`._config`: the ``gate`` section of the SLO spec (its keys, validation, defaults);
- :mod:`._checks`: attainment, burn rate, volume and percentile checks per class;
- :mod:`._regression`: a seeded bootstrap of the difference against a baseline run;
- :mod:`._render`: JUnit XML and a Markdown summary for a CI job.

Reading runs and baselines from files is :mod:`slokit.sources.runs`.
"""

from __future__ import annotations

from slokit.analysis.gate._checks import Check, GateResult, evaluate_gate
from slokit.analysis.gate._config import GateConfig, RegressionConfig, gate_config
from slokit.analysis.gate._regression import (
    Baseline,
    Regression,
    bootstrap_diff_ci,
    compare_baseline,
)
from slokit.analysis.gate._render import junit_xml, markdown_summary

__all__ = [
    "Baseline",
    "Check",
    "GateConfig",
    "GateResult",
    "Regression",
    "RegressionConfig",
    "bootstrap_diff_ci",
    "compare_baseline",
    "evaluate_gate",
    "gate_config",
    "junit_xml",
    "markdown_summary",
]
