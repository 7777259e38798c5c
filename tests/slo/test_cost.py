"""Cost per token, per good request, per successful task; energy per token."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from slo_builders import frag

from slokit.analysis.cost import compute_cost, task_outcomes
from slokit.analysis.slo import evaluate
from slokit.analysis.slo_spec import SloSpec
from slokit.records import GpuSample
from slokit.sources.runs import records_from_fragments
from slokit.store.db import open_store


def test_cost_of_the_window_is_replicas_gpus_price_and_hours(
    spec: SloSpec, known_records: list[Any]
) -> None:
    cost = compute_cost(known_records, spec, duration_s=100.0)
    assert cost is not None
    # 1 replica (r0) x 2 GPUs x $3.6/GPU-hour x 100 s = $0.20
    assert cost.replicas == 1
    assert cost.total_usd == pytest.approx(0.2)


def test_cost_per_good_request(spec: SloSpec, known_records: list[Any]) -> None:
    cost = compute_cost(known_records, spec, duration_s=100.0)
    assert cost is not None
    assert cost.good_requests == 9
    assert cost.usd_per_good_request == pytest.approx(0.2 / 9)


def test_cost_per_successful_task(spec: SloSpec, known_records: list[Any]) -> None:
    cost = compute_cost(known_records, spec, duration_s=100.0)
    assert cost is not None
    assert (cost.tasks.tasks, cost.tasks.successful) == (10, 5)
    assert cost.usd_per_successful_task == pytest.approx(0.2 / 5)


def test_a_task_with_one_failed_quality_check_fails_even_if_quality_is_optional(
    spec: SloSpec,
) -> None:
    lax = replace(spec, require_quality_pass=False)
    recs = records_from_fragments(
        [
            frag("a1", slo_class="batch", task_id="t", client_e2e_s=1.0),
            frag("a2", slo_class="batch", task_id="t", client_e2e_s=1.0, quality_pass=False),
        ]
    )
    summary = task_outcomes(recs, lax)
    assert (summary.tasks, summary.successful) == (1, 0)


def test_token_cost_is_split_by_prefill_and_decode_time(spec: SloSpec) -> None:
    # Prefill used 1 s of 4 s of request time: a quarter of $0.20 is for the 1000 input tokens.
    recs = records_from_fragments(
        [
            frag(
                "c1",
                slo_class="batch",
                replica="r0",
                prefill_s=0.5,
                decode_s=1.5,
                client_e2e_s=2.5,
                prompt_tokens=400,
                output_tokens=100,
            ),
            frag(
                "c2",
                slo_class="batch",
                replica="r0",
                prefill_s=0.5,
                decode_s=1.5,
                client_e2e_s=2.5,
                prompt_tokens=600,
                output_tokens=200,
            ),
        ]
    )
    cost = compute_cost(recs, spec, duration_s=100.0)
    assert cost is not None
    assert cost.prefill_share == pytest.approx(0.25)
    assert cost.usd_per_1m_input_tokens == pytest.approx(0.05 / 1000 * 1e6)
    assert cost.usd_per_1m_output_tokens == pytest.approx(0.15 / 300 * 1e6)


def test_without_server_phases_prefill_is_ttft_less_queue(spec: SloSpec) -> None:
    recs = records_from_fragments(
        [
            frag(
                "d1",
                slo_class="batch",
                replica="r0",
                client_ttft_s=1.5,
                queue_s=0.5,
                client_e2e_s=4.5,
                prompt_tokens=10,
                output_tokens=10,
            ),
        ]
    )
    cost = compute_cost(recs, spec, duration_s=10.0)
    assert cost is not None
    assert cost.prefill_share == pytest.approx(1.0 / (1.0 + 3.0))


def test_each_named_replica_costs(spec: SloSpec) -> None:
    recs = records_from_fragments(
        [
            frag("e1", slo_class="batch", replica="r0", client_e2e_s=1.0),
            frag("e2", slo_class="batch", replica="r1", client_e2e_s=1.0),
        ]
    )
    cost = compute_cost(recs, spec, duration_s=3600.0)
    assert cost is not None
    assert cost.total_usd == pytest.approx(2 * 2 * 3.6)


def test_records_without_replica_assume_one_and_say_so(spec: SloSpec) -> None:
    recs = records_from_fragments([frag("f1", slo_class="batch", client_e2e_s=1.0)])
    cost = compute_cost(recs, spec, duration_s=3600.0)
    assert cost is not None
    assert cost.replicas == 1
    assert any("assumed 1 replica" in a for a in cost.assumptions)


def test_no_price_means_no_cost(spec: SloSpec, known_records: list[Any]) -> None:
    assert compute_cost(known_records, replace(spec, gpu_hour_usd=None), duration_s=1.0) is None


def test_energy_is_the_counter_increase_across_gpus_and_resets() -> None:
    with open_store(":memory:") as store:
        store.append_gpu_samples(
            [
                GpuSample(ts=0.0, node="n", gpu="0", energy_j=1000.0),
                GpuSample(ts=10.0, node="n", gpu="0", energy_j=1500.0),
                GpuSample(ts=20.0, node="n", gpu="0", energy_j=200.0),  # reset: +200
                GpuSample(ts=0.0, node="n", gpu="1", energy_j=0.0),
                GpuSample(ts=20.0, node="n", gpu="1", energy_j=300.0),
            ]
        )
        assert store.reader().energy_increase(None, None) == pytest.approx(500 + 200 + 300)
        assert store.reader().energy_increase(10.0, 20.0) == pytest.approx(200 + 0)


def test_energy_per_output_token(spec: SloSpec, known_records: list[Any]) -> None:
    cost = compute_cost(known_records, spec, duration_s=100.0, energy_j=1200.0)
    assert cost is not None
    out = sum(r["output_tokens"] or 0 for r in known_records)
    assert cost.j_per_output_token == pytest.approx(1200.0 / out)


def test_cost_window_matches_the_slo_report(spec: SloSpec, known_records: list[Any]) -> None:
    rep = evaluate(known_records, spec)
    cost = compute_cost(known_records, spec, duration_s=rep.window.duration_s)
    assert cost is not None and cost.duration_s == 100.0


@pytest.mark.parametrize(
    ("value", "text"),
    [(1234.567, "$1,234.57"), (0.6094, "$0.6094"), (7.35e-05, "$0.00007350"), (None, "-")],
)
def test_money_keeps_four_significant_digits_below_a_dollar(value: float | None, text: str) -> None:
    from slokit.analysis.cost import money

    assert money(value) == text
