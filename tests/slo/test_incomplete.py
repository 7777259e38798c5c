"""Requests a load test cut at its end (status ``incomplete``): counted apart, never judged.

They are neither good nor bad: left out of attainment, burn rate, percentiles, the sweep's
steps and the gate, and shown beside the outcome counts.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from slo_builders import batch, interactive

from slokit.analysis.gate import Baseline, evaluate_gate, gate_config, markdown_summary
from slokit.analysis.slo import classify, evaluate, render_text, sli_labels, sweep_points
from slokit.analysis.slo_spec import SloSpec
from slokit.errors import BadInput
from slokit.records import RequestFragment
from slokit.sources.runs import records_from_fragments


def _cut(i: int, **kw: Any) -> RequestFragment:
    """An interactive request the load generator cut at its end: no answer, a long wait."""
    fields: dict[str, Any] = dict(
        status="incomplete", error_type="load_end", client_ttft_s=None, client_e2e_s=40.0,
        tpot_s=None, output_tokens=None,
    )  # fmt: skip
    fields.update(kw)
    return interactive(100 + i, **fields)


@pytest.fixture
def with_cut(known_records: list[Any]) -> list[dict[str, Any]]:
    """The known set plus three cut requests inside its span (1000..1100)."""
    cut = [_cut(i, arrival_ts=1080.0 + i, client_e2e_s=15.0) for i in range(3)]
    return [*known_records, *records_from_fragments(cut)]


def test_classify_calls_it_incomplete_before_any_other_rule(spec: SloSpec) -> None:
    rec = {"slo_class": "interactive", "status": "incomplete", "quality_pass": False}
    assert classify(rec, spec) == ("interactive", "incomplete")


def test_it_has_no_label_set_in_the_sli_counter(spec: SloSpec) -> None:
    assert sli_labels({"slo_class": "interactive", "status": "incomplete"}, spec) is None
    assert sli_labels({"slo_class": "interactive", "status": "timeout"}, spec) == {
        "class": "interactive", "replica": "", "model": "", "outcome": "error",
    }  # fmt: skip


def test_the_report_counts_it_apart_and_judges_the_rest_as_before(
    spec: SloSpec, known_records: list[Any], with_cut: list[dict[str, Any]]
) -> None:
    before = evaluate(known_records, spec)
    rep = evaluate(with_cut, spec)
    g = rep.class_report("interactive")
    assert g.incomplete == 3 and rep.overall.incomplete == 3
    assert rep.class_report("batch").incomplete == 0
    assert g.requests == 10 and g.outcomes == {"good": 6, "slow": 2, "error": 1, "quality_fail": 1}
    assert g.attainment == pytest.approx(0.6) == before.class_report("interactive").attainment
    assert g.burn_rate == pytest.approx(4.0)
    assert rep.overall.attainment == pytest.approx(9 / 14)
    assert g.output_tokens == before.class_report("interactive").output_tokens
    # Their 15 s waits are in no percentile: the E2E p99 is the judged requests' own.
    assert g.percentile("e2e", 0.99) == before.class_report("interactive").percentile("e2e", 0.99)
    assert g.burn_windows == before.class_report("interactive").burn_windows


def test_the_report_shows_it_in_text_and_json(
    spec: SloSpec, with_cut: list[dict[str, Any]]
) -> None:
    rep = evaluate(with_cut, spec)
    doc = json.loads(json.dumps(rep.to_json()))
    inter = next(c for c in doc["classes"] if c["name"] == "interactive")
    assert (inter["requests"], inter["incomplete"], doc["overall"]["incomplete"]) == (10, 3, 3)
    assert "incomplete" not in inter["outcomes"]
    assert next(c for c in doc["classes"] if c["name"] == "batch")["incomplete"] == 0
    text = render_text(rep)
    assert "requests 10: good 6  slow 2  error 1  quality_fail 1" in text
    assert text.count("incomplete 3 (cut at the load test's end; not judged)") == 2


def test_without_incomplete_requests_the_text_is_unchanged(
    spec: SloSpec, known_records: list[Any]
) -> None:
    assert "incomplete" not in render_text(evaluate(known_records, spec))


def test_a_class_with_only_incomplete_requests_has_no_attainment(spec: SloSpec) -> None:
    rep = evaluate(records_from_fragments([_cut(0)]), spec)
    g = rep.class_report("interactive")
    assert (g.requests, g.incomplete, g.attainment, g.burn_rate) == (0, 1, None, None)
    assert "no judged requests\n  incomplete 1" in render_text(rep)


def test_burn_windows_leave_it_out(spec: SloSpec) -> None:
    # Six minutes of good requests, then the cut ones: the 5-minute window holds good
    # requests and cut ones only, so its burn rate is 0, not the cut share.
    goods = [interactive(i, arrival_ts=1000.0 + 30 * i) for i in range(12)]
    cut = [_cut(i, arrival_ts=1300.0 + i, client_e2e_s=30.0) for i in range(6)]
    rep = evaluate(records_from_fragments([*goods, *cut]), spec)
    assert rep.class_report("interactive").burn_windows == {"5m": 0.0}


def test_a_sweep_step_judges_only_the_answered_requests(spec: SloSpec) -> None:
    frags = [
        interactive(i, arrival_ts=1000.0 + i) if i < 4 else _cut(i, arrival_ts=1000.0 + i)
        for i in range(8)
    ]
    recs = records_from_fragments([_renamed(f, f"step-{i + 1}") for i, f in enumerate(frags)])
    (point,) = sweep_points(recs, spec, by="run")
    assert point.attainment == {"interactive": 1.0} and point.meets_objectives
    assert point.requests == 8  # offered: the cut requests were sent too


def _renamed(f: RequestFragment, rid: str) -> RequestFragment:
    return f._replace(request_id=rid, fragment_id=f"client:{rid}")


# --- the gate -------------------------------------------------------------------------------


def test_the_gate_leaves_it_out_of_attainment_and_shows_it(
    spec: SloSpec, with_cut: list[dict[str, Any]]
) -> None:
    good = [interactive(i) for i in range(10)] + [batch(i) for i in range(2)]
    recs = [*records_from_fragments(good), *with_cut[-3:]]
    result = evaluate_gate(evaluate(recs, spec), spec)
    assert result.passed
    att = next(c for c in result.checks if c.cls == "interactive")
    assert "(10/10 good)" in att.message
    md = markdown_summary(result)
    assert "3 incomplete (cut at the load test's end, not judged)" in md
    assert "| interactive | 10 (+3 incomplete) | 10 |" in md
    assert "incomplete" not in markdown_summary(
        evaluate_gate(evaluate(records_from_fragments(good), spec), spec)
    )


def test_a_run_of_only_incomplete_requests_is_nothing_to_gate_on(spec: SloSpec) -> None:
    rep = evaluate(records_from_fragments([_cut(0), _cut(1)]), spec)
    with pytest.raises(BadInput, match="all 2 requests are incomplete"):
        evaluate_gate(rep, spec)


def test_the_regression_bootstrap_leaves_it_out_of_both_samples(spec: SloSpec) -> None:
    good = records_from_fragments([interactive(i) for i in range(40)])
    cut = records_from_fragments([_cut(i) for i in range(40)])
    cfg = gate_config(spec)
    result = evaluate_gate(
        evaluate([*good, *cut], spec),
        spec,
        config=cfg,
        current_records=[*good, *cut],
        baseline=Baseline(records=good),
    )
    reg = next(r for r in result.regressions if r.cls == "interactive")
    assert (reg.baseline, reg.current, reg.regressed) == (1.0, 1.0, False)
