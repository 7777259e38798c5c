"""SLI accounting on fake time: each request counted once, grace after its first fragment."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from slokit.analysis.slo_spec import load_spec
from slokit.records import RequestFragment
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.sli import SliAccountant
from slokit.store.db import Store, open_store

SLO = Path(__file__).resolve().parents[2] / "examples" / "slo" / "chat.yaml"


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def _vllm(rid: str, *, e2e: float = 1.0, ttft: float = 0.1) -> RequestFragment:
    return RequestFragment(rid, "vllm", f"vllm:{rid}", replica="pod-a", model="m",
                           arrival_ts=1_800_000_000.0, ttft_s=ttft, e2e_s=e2e,
                           output_tokens=10)  # fmt: skip


Setup = tuple[Store, SliAccountant, Clock, CollectorRegistry]


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    clock = Clock()
    store = open_store(tmp_path / "sli.duckdb", clock=clock)
    reg = CollectorRegistry()
    acc = SliAccountant(SidecarMetrics(reg), load_spec(SLO), grace_s=30, clock=clock)
    return store, acc, clock, reg


def _count(reg: CollectorRegistry, outcome: str) -> float:
    labels = {"class": "default", "replica": "pod-a", "model": "m", "outcome": outcome}
    return reg.get_sample_value("slokit_requests_total", labels) or 0.0


def test_a_request_is_counted_only_after_the_grace_period(setup: Setup) -> None:
    store, acc, clock, reg = setup
    clock.t += 1
    store.append_fragments([_vllm("a")])
    clock.t += 29
    assert acc.tick(store.cursor()) == 0
    clock.t += 2
    assert acc.tick(store.cursor()) == 1
    assert _count(reg, "good") == 1


def test_late_fragments_and_retries_never_count_a_request_twice(setup: Setup) -> None:
    store, acc, clock, reg = setup
    clock.t += 1
    store.append_fragments([_vllm("a")])
    clock.t += 40
    acc.tick(store.cursor())
    store.append_fragments([_vllm("a")])  # an exporter retry
    store.append_fragments([RequestFragment("a", "quality", "quality:a", quality_pass=False)])
    clock.t += 40
    acc.tick(store.cursor())
    assert _count(reg, "good") == 1
    assert _count(reg, "quality_fail") == 0


def test_a_fragment_hours_after_its_requests_first_does_not_count_it_again(
    setup: Setup,
) -> None:
    store, acc, clock, reg = setup
    clock.t += 1
    store.append_fragments([_vllm("a")])
    clock.t += 40
    assert acc.tick(store.cursor()) == 1
    clock.t += 7 * 3600  # a day-long batch job's feedback, a re-ingest of an old export
    store.append_fragments([RequestFragment("a", "quality", "quality:a", quality_pass=True)])
    clock.t += 40
    assert acc.tick(store.cursor()) == 0
    assert _count(reg, "good") == 1


def test_outcomes_follow_the_slo_spec(setup: Setup) -> None:
    store, acc, clock, reg = setup
    clock.t += 1
    store.append_fragments([_vllm("fast"), _vllm("slow", ttft=5.0)])
    store.append_fragments([RequestFragment("bad", "client", "client:bad", replica="pod-a",
                                            model="m", status="error")])  # fmt: skip
    clock.t += 31
    assert acc.tick(store.cursor()) == 3
    assert (_count(reg, "good"), _count(reg, "slow")) == (1, 1)
    errors = [m.value for f in reg.collect() for m in f.samples
              if m.name == "slokit_requests_total" and m.labels["outcome"] == "error"]  # fmt: skip
    assert errors == [1.0]
    assert reg.get_sample_value("slokit_output_tokens_total", {
        "class": "default", "replica": "pod-a", "model": "m", "outcome": "good"}) == 10  # fmt: skip


def test_cost_per_good_request_divides_the_window_cost(setup: Setup) -> None:
    store, acc, clock, reg = setup
    for _ in range(3600):  # one replica up for an hour at 4 USD/h
        acc.accrue("pod-a", 1.0)
    clock.t += 1
    store.append_fragments([_vllm(f"r{i}") for i in range(4)])
    clock.t += 31
    acc.tick(store.cursor())
    assert reg.get_sample_value("slokit_gpu_cost_usd_total", {"replica": "pod-a"}) == pytest.approx(
        4.0
    )
    assert reg.get_sample_value("slokit_cost_per_good_request_usd", {"class": "default"}) == (
        pytest.approx(1.0)
    )
    assert reg.get_sample_value("slokit_cost_per_successful_task_usd", {}) == pytest.approx(1.0)


def _outcomes(reg: CollectorRegistry) -> set[str]:
    return {m.labels["outcome"] for f in reg.collect() for m in f.samples
            if m.name == "slokit_requests_total"}  # fmt: skip


@pytest.mark.parametrize("spec", [True, False], ids=["with spec", "without spec"])
def test_an_incomplete_request_is_counted_apart_never_as_bad(tmp_path: Path, spec: bool) -> None:
    # A load test cut r1 at its end; vLLM finished it anyway (client outcome first:
    # incomplete). It is no error and no series of slokit_requests_total.
    clock = Clock()
    store = open_store(tmp_path / "sli.duckdb", clock=clock)
    reg = CollectorRegistry()
    acc = SliAccountant(SidecarMetrics(reg), load_spec(SLO) if spec else None, clock=clock)
    clock.t += 1
    store.append_fragments([
        _vllm("r1"),
        RequestFragment("r1", "client", "client:r1", status="incomplete", error_type="load_end",
                        task_id="t1"),
        _vllm("r2"),
    ])  # fmt: skip
    clock.t += 31
    assert acc.tick(store.cursor()) == 2
    assert _outcomes(reg) == {"good"}
    cls = "default" if spec else "unclassified"
    assert reg.get_sample_value("slokit_requests_incomplete_total", {"class": cls}) == 1
    assert reg.get_sample_value("slokit_output_tokens_total", {
        "class": cls, "replica": "pod-a", "model": "m", "outcome": "good"}) == 10  # fmt: skip
