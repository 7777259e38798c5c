"""Fault injection at run time through /admin/faults, and scenario presets."""

from __future__ import annotations

import time

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from slokit.lab.sim.background import BackgroundSim, running_cluster
from slokit.lab.sim.faults import SCENARIOS, FaultError, Faults, apply_update, scenario_faults
from slokit.lab.sim.settings import SimSettings


def test_admin_endpoint_sets_and_reports_faults(sim: BackgroundSim) -> None:
    r = httpx.post(f"{sim.url}/admin/faults", json={"gpu_clock_ratio": 0.5, "kv_blocks": 100})
    assert r.status_code == 200
    state = httpx.get(f"{sim.url}/admin/faults").json()
    assert state["faults"]["gpu_clock_ratio"] == 0.5 and state["faults"]["kv_blocks"] == 100
    assert sim.cluster.replicas[0].core.kv.capacity == 100
    httpx.post(f"{sim.url}/admin/faults", json={"clear": True})
    assert httpx.get(f"{sim.url}/admin/faults").json()["faults"] == Faults().to_json()


def test_admin_endpoint_rejects_bad_faults(sim: BackgroundSim) -> None:
    for body in ({"gpu_clock_ratio": 3}, {"nope": 1}, {"spec_decode": {"acceptance_rate": "hi"}}):
        r = httpx.post(f"{sim.url}/admin/faults", json=body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"


def test_spec_decode_fault_adds_spec_counters(sim: BackgroundSim) -> None:
    assert "vllm:spec_decode_num_drafts_total" not in httpx.get(f"{sim.url}/metrics").text
    httpx.post(f"{sim.url}/admin/faults",
               json={"spec_decode": {"num_speculative_tokens": 3, "acceptance_rate": 0.2}})  # fmt: skip
    httpx.post(f"{sim.url}/v1/completions", json={"prompt": "a", "max_tokens": 50})
    text = httpx.get(f"{sim.url}/metrics").text
    assert 'vllm:spec_decode_num_draft_tokens_total{engine="0"' in text


def test_error_rate_fault_fails_requests_with_vllm_500(sim: BackgroundSim) -> None:
    httpx.post(f"{sim.url}/admin/faults", json={"error_rate": 1.0})
    r = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "a", "max_tokens": 2})
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"


def test_metrics_blackout_answers_503(sim: BackgroundSim) -> None:
    httpx.post(f"{sim.url}/admin/faults", json={"metrics_blackout": True})
    assert httpx.get(f"{sim.url}/metrics").status_code == 503
    assert httpx.get(sim.dcgm_url).status_code == 503


def test_crash_fails_in_flight_requests_and_restarts_with_fresh_counters(
    sim: BackgroundSim,
) -> None:
    httpx.post(f"{sim.url}/v1/completions", json={"prompt": "a", "max_tokens": 4})
    assert (
        'vllm:request_success_total{engine="0",finished_reason="length"'
        in httpx.get(f"{sim.url}/metrics").text
    )
    body = {"prompt": "a", "max_tokens": 3000, "stream": True}
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=body) as r:
        lines = r.iter_lines()
        next(lines)
        httpx.post(f"{sim.url}/admin/faults", json={"crash": {"down_s": 0.5}})
        rest = "\n".join(lines)
    assert '"InternalServerError"' in rest and rest.rstrip().endswith("data: [DONE]")
    deadline = time.monotonic() + 10
    while True:
        try:
            text = httpx.get(f"{sim.url}/metrics").text
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert 'finished_reason="length",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.0' in text
    assert httpx.get(f"{sim.url}/admin/faults").json()["restarts"] == 1


def test_every_scenario_preset_is_valid() -> None:
    for name in SCENARIOS:
        scenario_faults(name)
    with pytest.raises(FaultError):
        scenario_faults("no_such_scenario")


def test_scenarios_cover_every_diagnostic_rule_id() -> None:
    rules = {"queue_saturation", "prefill_saturation", "decode_saturation", "kv_pressure",
             "frontend_bound", "prefix_affinity_loss", "beyond_knee", "gpu_throttle", "gpu_xid",
             "error_burst", "spec_decode_low_acceptance", "telemetry_gap"}  # fmt: skip
    assert rules | {"healthy"} <= set(SCENARIOS)


def test_update_merges_into_current_faults() -> None:
    first = apply_update(Faults(), {"xid": 48}).faults
    second = apply_update(first, {"step_gap_s": 0.01}).faults
    assert second.xid == 48 and second.step_gap_s == 0.01


def test_frontend_delay_shows_in_ttft_not_in_engine_queue() -> None:
    spans = InMemorySpanExporter()
    settings = SimSettings.for_scenario("healthy")
    with running_cluster(settings, exporter_factory=lambda: spans) as sim:
        httpx.post(f"{sim.url}/admin/faults", json={"frontend_delay_s": 0.2})
        httpx.post(f"{sim.url}/v1/completions", json={"prompt": "a", "max_tokens": 2})
        sim.cluster.replicas[0].emitter.provider.force_flush()
    (span,) = spans.get_finished_spans()
    attrs = dict(span.attributes or {})
    ttft = float(attrs["gen_ai.latency.time_to_first_token"])  # type: ignore[arg-type]
    queue = float(attrs["gen_ai.latency.time_in_queue"])  # type: ignore[arg-type]
    # the delay is before the engine: all of it is in TTFT, none of it in the engine's queue
    # (relative to what the server reported, so a busy machine cannot break it)
    assert ttft - queue >= 0.2


def test_client_disconnect_aborts_the_request(sim: BackgroundSim) -> None:
    body = {"prompt": "a", "max_tokens": 3000, "stream": True}
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=body) as r:
        next(r.iter_lines())
    deadline = time.monotonic() + 10
    while 'finished_reason="abort",model_name="Qwen/Qwen2.5-7B-Instruct"} 1.0' not in (
        text := httpx.get(f"{sim.url}/metrics").text
    ):
        assert time.monotonic() < deadline, text
        time.sleep(0.05)
    assert sim.cluster.replicas[0].core.running == []


def test_scenario_settings_take_preset_knobs_unless_overridden() -> None:
    kv = SimSettings.for_scenario("kv_pressure")
    assert kv.engine_config().num_gpu_blocks == 2048
    assert SimSettings.for_scenario("kv_pressure", num_gpu_blocks=500).num_gpu_blocks == 500
    assert SimSettings.for_scenario("gpu_throttle").faults.gpu_clock_ratio == 0.45
