"""evaluate(): attainment, burn rate, observed goodput, percentiles, windows, max goodput.

The numbers come from the hand-computed set in conftest.known_fragments().
"""

from __future__ import annotations

from typing import Any

import pytest
from slo_builders import frag

from slokit.analysis.slo import (
    evaluate,
    max_goodput,
    quantile,
    quantile_ci,
    sweep_points,
)
from slokit.analysis.slo_spec import SloSpec
from slokit.errors import BadInput
from slokit.sources.runs import records_from_fragments


def test_attainment_per_class_and_overall(spec: SloSpec, known_records: list[Any]) -> None:
    rep = evaluate(known_records, spec)
    assert rep.class_report("interactive").attainment == pytest.approx(0.6)
    assert rep.class_report("batch").attainment == pytest.approx(0.75)
    assert rep.overall.attainment == pytest.approx(9 / 14)


def test_outcome_counts(spec: SloSpec, known_records: list[Any]) -> None:
    rep = evaluate(known_records, spec)
    assert rep.class_report("interactive").outcomes == {
        "good": 6, "slow": 2, "error": 1, "quality_fail": 1,
    }  # fmt: skip
    assert rep.class_report("batch").outcomes == {
        "good": 3, "slow": 1, "error": 0, "quality_fail": 0,
    }  # fmt: skip


def test_unmeasurable_bounds_are_counted(spec: SloSpec, known_records: list[Any]) -> None:
    rep = evaluate(known_records, spec)
    # i9 finished ok without a TPOT (and i8, quality_fail, was measured); errors are not counted.
    assert rep.class_report("interactive").unmeasurable == {"tpot_ms": 1}


def test_burn_rate_is_budget_spent_over_budget(spec: SloSpec, known_records: list[Any]) -> None:
    rep = evaluate(known_records, spec)
    assert rep.class_report("interactive").burn_rate == pytest.approx(0.4 / 0.1)
    assert rep.class_report("batch").burn_rate == pytest.approx(0.25 / 0.5)


def test_no_window_uses_the_data_span(spec: SloSpec, known_records: list[Any]) -> None:
    w = evaluate(known_records, spec).window
    assert (w.since, w.until, w.duration_s, w.basis) == (1000.0, 1100.0, 100.0, "data")


def test_observed_goodput_in_requests_and_tokens(spec: SloSpec, known_records: list[Any]) -> None:
    rep = evaluate(known_records, spec)
    assert rep.overall.good_rps == pytest.approx(9 / 100)
    assert rep.overall.good_output_tokens_per_s == pytest.approx((6 * 50 + 3 * 200) / 100)
    assert rep.class_report("interactive").good_rps == pytest.approx(0.06)


def test_a_window_keeps_requests_arriving_inside_it(
    spec: SloSpec, known_records: list[Any]
) -> None:
    rep = evaluate(known_records, spec, since=1000.0, until=1050.0)
    inter = rep.class_report("interactive")
    assert inter.requests == 5 and inter.attainment == 1.0
    assert rep.class_report("batch").requests == 0
    assert rep.window.duration_s == 50.0
    assert inter.good_rps == pytest.approx(5 / 50)


def test_burn_rate_over_sre_windows_that_the_data_spans(spec: SloSpec) -> None:
    # 2 hours of interactive traffic, one request a minute; the last 5 minutes all fail.
    frags = []
    for i in range(120):
        bad = i >= 115
        frags.append(
            frag(
                f"w{i}",
                slo_class="interactive",
                arrival_ts=60.0 * i,
                client_ttft_s=0.9 if bad else 0.1,
                tpot_s=0.01,
                client_e2e_s=1.0,
                output_tokens=10,
            )
        )
    rep = evaluate(records_from_fragments(frags), spec, since=0.0, until=7200.0)
    windows = rep.class_report("interactive").burn_windows
    assert windows["5m"] == pytest.approx(1.0 / 0.1)  # all 5 of the last 5 minutes failed
    assert windows["1h"] == pytest.approx((5 / 60) / 0.1)
    assert windows["2h"] == pytest.approx((5 / 120) / 0.1)
    assert "6h" not in windows


def test_percentiles_are_numpy_linear_with_order_statistic_ci(spec: SloSpec) -> None:
    frags = [
        frag(
            f"p{i}",
            slo_class="interactive",
            arrival_ts=float(i),
            client_ttft_s=i / 1000,
            tpot_s=0.01,
            output_tokens=10,
        )
        for i in range(1, 101)
    ]
    rep = evaluate(records_from_fragments(frags), spec)
    p50 = rep.class_report("interactive").percentile("ttft", 0.5)
    assert p50 is not None
    assert p50.value_s == pytest.approx(0.0505)
    # The classic distribution-free 95% interval for the median of 100: x(40) .. x(61).
    assert (p50.ci_low_s, p50.ci_high_s) == (0.040, 0.061)


def test_quantile_matches_numpy() -> None:
    import numpy as np

    xs = sorted([3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0])
    for q in (0.0, 0.5, 0.95, 0.99, 1.0):
        assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))


def test_a_tail_quantile_of_few_samples_has_no_upper_bound() -> None:
    lo, hi = quantile_ci([float(i) for i in range(10)], 0.99)
    assert hi is None and lo is not None


def _sweep_frags(run: str, rate: float, n: int, t0: float, ttft: float) -> list[Any]:
    return [
        frag(
            f"{run}-{k + 1}",
            slo_class="interactive",
            arrival_ts=t0 + k / rate,
            client_ttft_s=ttft,
            tpot_s=0.01,
            client_e2e_s=0.5,
            output_tokens=10,
        )
        for k in range(n)
    ]


def test_max_goodput_is_the_highest_rate_meeting_every_objective(spec: SloSpec) -> None:
    frags = (
        _sweep_frags("sw-s1", 1.0, 20, 0.0, 0.1)
        + _sweep_frags("sw-s2", 2.0, 40, 100.0, 0.2)
        + _sweep_frags("sw-s3", 4.0, 80, 200.0, 0.9)  # every request too slow
    )
    points = sweep_points(records_from_fragments(frags), spec, by="run")
    assert [p.offered_rps for p in points] == pytest.approx([1.0, 2.0, 4.0])
    assert [p.meets_objectives for p in points] == [True, True, False]
    assert max_goodput(points).rate_rps == pytest.approx(2.0)
    assert max_goodput(points).bounded


def test_a_sweep_where_every_step_passes_gives_only_a_lower_bound(spec: SloSpec) -> None:
    frags = _sweep_frags("a", 1.0, 10, 0.0, 0.1) + _sweep_frags("b", 2.0, 10, 100.0, 0.1)
    mg = max_goodput(sweep_points(records_from_fragments(frags), spec, by="run"))
    assert mg.rate_rps == pytest.approx(2.0) and not mg.bounded


def test_max_goodput_stops_at_the_first_failing_step(spec: SloSpec) -> None:
    frags = _sweep_frags("a", 1.0, 10, 0.0, 0.9) + _sweep_frags("b", 2.0, 10, 100.0, 0.1)
    mg = max_goodput(sweep_points(records_from_fragments(frags), spec, by="run"))
    assert mg.rate_rps is None


def test_sweep_by_time_window_counts_arrivals_per_window(spec: SloSpec) -> None:
    frags = _sweep_frags("x", 1.0, 60, 0.0, 0.1) + _sweep_frags("y", 3.0, 181, 60.0, 0.1)
    points = sweep_points(records_from_fragments(frags), spec, by=60.0)
    assert [p.offered_rps for p in points] == pytest.approx([1.0, 3.0])


def test_a_sweep_grouping_must_be_run_or_seconds(spec: SloSpec) -> None:
    with pytest.raises(BadInput, match="run"):
        sweep_points([], spec, by="rate")


def test_report_json_labels_both_goodputs(spec: SloSpec, known_records: list[Any]) -> None:
    frags_doc = evaluate(known_records, spec, sweep="run").to_json()
    assert "good_requests_per_s" in frags_doc["overall"]["observed_goodput"]
    assert "DistServe" in frags_doc["max_goodput"]["definition"]
