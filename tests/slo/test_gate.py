"""The gate: config validation, checks, regression against a baseline, JUnit and Markdown."""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from slo_builders import SPEC_YAML, frag

from slokit.analysis.gate import (
    Baseline,
    bootstrap_diff_ci,
    evaluate_gate,
    gate_config,
    junit_xml,
    markdown_summary,
)
from slokit.analysis.slo import evaluate
from slokit.analysis.slo_spec import SloSpec, load_spec
from slokit.errors import BadInput
from slokit.sources.runs import records_from_fragments as merged


def spec_with(tmp_path: Path, gate_yaml: str) -> SloSpec:
    p = tmp_path / "gated.yaml"
    p.write_text(SPEC_YAML + "gate:\n" + gate_yaml)
    return load_spec(p)


# --- config ---------------------------------------------------------------------------------


def test_without_a_gate_section_each_class_must_reach_its_objective(spec: SloSpec) -> None:
    cfg = gate_config(spec)
    assert cfg.min_attainment == {"interactive": 0.9, "batch": 0.5}
    assert cfg.max_burn_rate == {}


def test_a_number_applies_to_every_class_and_a_map_to_named_ones(tmp_path: Path) -> None:
    cfg = gate_config(spec_with(tmp_path, "  max_burn_rate: 2\n  min_attainment: {batch: 0.7}\n"))
    assert cfg.max_burn_rate == {"interactive": 2.0, "batch": 2.0}
    assert cfg.min_attainment == {"batch": 0.7}


@pytest.mark.parametrize(
    ("gate_yaml", "expected"),
    [
        (
            "  min_attainment: 1.5\n",
            r"gated.yaml:\d+: gate.min_attainment: must be a number in \[0, 1\]",
        ),
        (
            "  min_attainment: {chat: 0.9}\n",
            r"gated.yaml:\d+: gate.min_attainment.chat: no such class",
        ),
        ("  max_burn: 2\n", r"gated.yaml:\d+: gate: unknown keys \['max_burn'\]"),
        ("  min_requests: -1\n", r"gated.yaml:\d+: gate.min_requests: must be a number >= 0"),
        (
            "  min_requests: {batch: 2.5}\n",
            r"gated.yaml:\d+: gate.min_requests: must be an integer",
        ),
        (
            "  percentiles:\n    batch: {ttft_p90_ms: 5}\n",
            r"gated.yaml:\d+: gate.percentiles.batch.ttft_p90_ms: expected",
        ),
        ("  regression: {confidence: 2}\n", r"gated.yaml:\d+: gate.regression.confidence"),
        ("  regression: {metrics: [speed]}\n", r"gated.yaml:\d+: gate.regression.metrics"),
    ],
)
def test_bad_gate_settings_name_the_field_and_line(
    tmp_path: Path, gate_yaml: str, expected: str
) -> None:
    with pytest.raises(BadInput, match=expected):
        spec_with(tmp_path, gate_yaml)  # the spec's loader validates its gate section


def test_the_error_line_is_the_line_of_the_offending_mapping(tmp_path: Path) -> None:
    gate_yaml = "  min_requests: 10\n  percentiles:\n    batch:\n      e2e_p95_ms: -3\n"
    lines = (SPEC_YAML + "gate:\n" + gate_yaml).splitlines()
    expected_line = lines.index("      e2e_p95_ms: -3") + 1
    with pytest.raises(BadInput, match=rf"gated.yaml:{expected_line}: "):
        spec_with(tmp_path, gate_yaml)  # the spec's loader validates its gate section


# --- checks ---------------------------------------------------------------------------------


def test_the_known_set_breaches_interactive_and_passes_batch(
    spec: SloSpec, known_records: list[Any]
) -> None:
    result = evaluate_gate(evaluate(known_records, spec), spec)
    verdicts = {(c.cls, c.name): c.passed for c in result.checks}
    assert verdicts == {
        ("interactive", "attainment >= 0.9"): False,
        ("batch", "attainment >= 0.5"): True,
    }
    assert result.exit_code == 1


def test_burn_rate_and_percentile_bounds(tmp_path: Path, known_records: list[Any]) -> None:
    spec = spec_with(
        tmp_path,
        "  max_burn_rate: 4\n  percentiles:\n    batch: {e2e_p50_ms: 5000, e2e_p95_ms: 15000}\n",
    )
    result = evaluate_gate(evaluate(known_records, spec), spec)
    verdicts = {(c.cls, c.name): c.passed for c in result.checks}
    assert verdicts[("interactive", "burn_rate <= 4")] is True  # exactly 4.0
    assert verdicts[("batch", "burn_rate <= 4")] is True
    assert verdicts[("batch", "e2e_p50_ms <= 5000")] is False  # (5+10)/2 s = 7.5 s
    assert verdicts[("batch", "e2e_p95_ms <= 15000")] is False
    assert result.exit_code == 1


def test_a_class_without_requests_is_skipped_unless_min_requests(
    tmp_path: Path, spec: SloSpec
) -> None:
    recs = merged([frag("x", slo_class="batch", client_e2e_s=1.0)])
    result = evaluate_gate(evaluate(recs, spec), spec)
    skipped = [c for c in result.checks if c.passed is None]
    assert [c.cls for c in skipped] == ["interactive"] and result.passed
    strict = spec_with(tmp_path, "  min_requests: 1\n")
    assert evaluate_gate(evaluate(recs, strict), strict).exit_code == 1


def test_no_requests_at_all_is_bad_input(spec: SloSpec) -> None:
    with pytest.raises(BadInput, match="no requests"):
        evaluate_gate(evaluate([], spec), spec)


# --- regression -----------------------------------------------------------------------------


def _run(prefix: str, n: int, ttft_ms: float, seed: int, *, spread: float = 40.0) -> list[Any]:
    rng = random.Random(seed)
    return merged(
        [
            frag(
                f"{prefix}-{i}",
                slo_class="interactive",
                arrival_ts=float(i),
                client_ttft_s=max(0.001, rng.gauss(ttft_ms, spread)) / 1000,
                tpot_s=rng.uniform(0.01, 0.03),
                client_e2e_s=1.0,
                output_tokens=20,
            )
            for i in range(n)
        ]
    )


def _lax(spec: SloSpec) -> SloSpec:
    """Loose bounds, so attainment is 100% and only latency regressions are in play."""
    from slokit.analysis.slo_spec import SloClass

    return replace(
        spec,
        classes=(SloClass("interactive", 0.5, {"slo_class": ("interactive",)}, ttft_ms=10000.0),),
    )


def test_two_runs_from_the_same_distribution_show_no_regression(spec: SloSpec) -> None:
    lax = _lax(spec)
    base, cur = _run("a", 400, 200, seed=1), _run("b", 400, 200, seed=2)
    result = evaluate_gate(
        evaluate(cur, lax), lax, current_records=cur, baseline=Baseline(records=base)
    )
    assert [r.regressed for r in result.regressions] == [False, False, False, False]
    assert result.passed


def test_a_shifted_run_is_a_regression(spec: SloSpec) -> None:
    lax = _lax(spec)
    base, cur = _run("a", 400, 200, seed=1), _run("b", 400, 260, seed=2)
    result = evaluate_gate(
        evaluate(cur, lax), lax, current_records=cur, baseline=Baseline(records=base)
    )
    flagged = {r.metric for r in result.regressions if r.regressed}
    assert flagged == {"ttft_p95"}
    assert result.exit_code == 1


def test_an_attainment_drop_beyond_noise_is_a_regression(spec: SloSpec) -> None:
    base = _run("a", 400, 300, seed=1, spread=100)  # about 98% under 500 ms
    cur = _run("b", 400, 420, seed=2, spread=100)  # about 79%
    result = evaluate_gate(
        evaluate(cur, spec), spec, current_records=cur, baseline=Baseline(records=base)
    )
    att = next(r for r in result.regressions if r.metric == "attainment")
    assert att.regressed is True and att.diff_ci is not None and att.diff_ci[1] < 0


def test_the_bootstrap_is_reproducible_with_its_seed() -> None:
    a, b = [float(i % 17) for i in range(300)], [float(i % 13) for i in range(300)]
    one = bootstrap_diff_ci(a, b, 0.95, confidence=0.95, resamples=500, seed=7)
    assert one == bootstrap_diff_ci(a, b, 0.95, confidence=0.95, resamples=500, seed=7)
    assert one != bootstrap_diff_ci(a, b, 0.95, confidence=0.95, resamples=500, seed=8)


def test_a_report_baseline_compares_attainment_from_its_counts(spec: SloSpec) -> None:
    base = _run("a", 400, 300, seed=1, spread=100)
    cur = _run("b", 400, 420, seed=2, spread=100)
    base_report = evaluate(base, spec).to_json()
    from_records = evaluate_gate(
        evaluate(cur, spec), spec, current_records=cur, baseline=Baseline(records=base)
    )
    from_report = evaluate_gate(
        evaluate(cur, spec), spec, current_records=cur, baseline=Baseline(report=base_report)
    )
    pick = lambda res: next(r for r in res.regressions if r.metric == "attainment")  # noqa: E731
    assert pick(from_report).baseline == pick(from_records).baseline
    assert pick(from_report).regressed is True


# --- outputs --------------------------------------------------------------------------------


def test_junit_has_one_testcase_per_class_and_check(
    tmp_path: Path, known_records: list[Any]
) -> None:
    spec = spec_with(tmp_path, "  max_burn_rate: 2\n  min_attainment: 0.7\n")
    result = evaluate_gate(evaluate(known_records, spec), spec)
    root = ET.fromstring(junit_xml(result))
    suite = root.find("testsuite")
    assert suite is not None
    cases = {(c.get("classname"), c.get("name")): c for c in suite.iter("testcase")}
    assert set(cases) == {
        ("slo.chat.interactive", "attainment >= 0.7"),
        ("slo.chat.interactive", "burn_rate <= 2"),
        ("slo.chat.batch", "attainment >= 0.7"),
        ("slo.chat.batch", "burn_rate <= 2"),
    }
    failed = {k for k, c in cases.items() if c.find("failure") is not None}
    assert failed == {
        ("slo.chat.interactive", "attainment >= 0.7"),
        ("slo.chat.interactive", "burn_rate <= 2"),
    }
    assert (suite.get("tests"), suite.get("failures")) == ("4", "2")
    failure = cases[("slo.chat.interactive", "attainment >= 0.7")].find("failure")
    assert failure is not None and "60.00%" in (failure.get("message") or "")


def test_markdown_summary_shows_verdict_table_and_failed_checks(
    spec: SloSpec, known_records: list[Any]
) -> None:
    md = markdown_summary(evaluate_gate(evaluate(known_records, spec), spec))
    lines = md.splitlines()
    assert lines[0] == "## slokit gate: FAIL (1 of 2 checks breached)"
    assert "| interactive | 10 | 6 | 60.00% | 90.00% | 4.00 | 0.060 |" in md
    assert (
        "| **FAIL** | interactive | attainment >= 0.9 | attainment 60.00% (6/10 good) < 90.00% |"
    ) in lines
    assert "| pass | batch | attainment >= 0.5 |" in md


def test_markdown_lists_baseline_comparisons(spec: SloSpec) -> None:
    lax = _lax(spec)
    base, cur = _run("a", 300, 200, seed=1), _run("b", 300, 260, seed=2)
    md = markdown_summary(
        evaluate_gate(evaluate(cur, lax), lax, current_records=cur, baseline=Baseline(records=base))
    )
    assert "### Compared with the baseline" in md
    assert "| interactive | ttft_p95 |" in md and "| **yes** |" in md
    assert "no (within noise)" in md


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_the_order_statistic_bootstrap_matches_brute_force_resampling(q: float) -> None:
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.lognormal(-2.0, 0.6, size=500)
    # Against a constant baseline the difference is the statistic itself.
    lo, hi = bootstrap_diff_ci(x.tolist(), [0.0], q, confidence=0.9, resamples=4000, seed=1)
    brute = np.quantile(x[rng.integers(0, len(x), size=(4000, len(x)))], q, axis=1)
    b_lo, b_hi = np.quantile(brute, [0.05, 0.95])
    assert lo == pytest.approx(b_lo, rel=0.05)
    assert hi == pytest.approx(b_hi, rel=0.05)


def test_the_attainment_bootstrap_matches_the_binomial_spread() -> None:
    # 900 of 1000 good: the 95% interval of the mean is about 0.9 +- 1.96 * sqrt(.09/1000).
    lo, hi = bootstrap_diff_ci(
        [1.0] * 900 + [0.0] * 100, [0.0], None, confidence=0.95, resamples=20000, seed=0
    )
    half = 1.96 * (0.09 / 1000) ** 0.5
    assert lo == pytest.approx(0.9 - half, abs=0.002)
    assert hi == pytest.approx(0.9 + half, abs=0.002)
