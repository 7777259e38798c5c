"""The simulator serves /metrics in the text format, as vLLM's Python frontend does, and in
OpenMetrics 1.0 to a client that accepts only that (as vLLM's Rust frontend serves it); both
give the same engine sample, with vLLM's newer series (waiting by reason, prompt tokens by
source, aborts)."""

from __future__ import annotations

import httpx

from slokit.lab.sim.background import BackgroundSim as RunningSim
from slokit.lab.sim.engine import EngineConfig, EngineCore, make_request, simulate
from slokit.lab.sim.metrics import VllmMetrics
from slokit.lab.sim.roofline import GPUS, MODELS, Roofline
from slokit.sources.exposition import parse_exposition
from slokit.sources.vllm_metrics import engine_samples_from_families, parse_vllm_metrics

OM_ACCEPT = "application/openmetrics-text; version=1.0.0"


def _metrics() -> VllmMetrics:
    cfg = EngineConfig(num_gpu_blocks=64, max_num_batched_tokens=512)
    core = EngineCore(cfg, Roofline(MODELS["7b"], GPUS["h100"]))
    metrics = VllmMetrics("tiny", cfg, 1 << 30)
    core.listeners.append(metrics)
    reqs = [make_request(f"r{i}", [7] * 64 + list(range(i, i + 100)), 50) for i in range(8)]
    simulate(core, [(0.01 * i, r) for i, r in enumerate(reqs)])
    return metrics


def test_render_negotiates_the_format() -> None:
    metrics = _metrics()
    text, text_type = metrics.render_for(None)
    om, om_type = metrics.render_for(OM_ACCEPT)
    assert text_type.startswith("text/plain; version=0.0.4")
    assert om_type.startswith("application/openmetrics-text; version=1.0.0")
    assert om.decode().endswith("# EOF\n") and not text.decode().endswith("# EOF\n")
    as_text = parse_vllm_metrics(text, ts=1.0, replica="r")
    assert parse_vllm_metrics(om, ts=1.0, replica="r") == as_text
    slow = engine_samples_from_families(parse_exposition(om, fast=False), ts=1.0, replica="r")
    assert slow == as_text


def test_newer_series_are_consistent_with_the_state() -> None:
    (es,) = parse_vllm_metrics(_metrics().render(), ts=1.0, replica="r")
    assert set(es.waiting_by_reason) == {"capacity", "deferred"}
    assert sum(es.waiting_by_reason.values()) == es.waiting  # vLLM: reasons sum to waiting
    by_source = es.prompt_tokens_by_source
    assert set(by_source) == {"local_compute", "local_cache_hit", "external_kv_transfer"}
    assert by_source["local_compute"] + by_source["local_cache_hit"] == es.prompt_tokens_total
    assert by_source["local_cache_hit"] == es.prefix_cache_hits_total
    kv = es.histograms["prefill_kv_computed_tokens"]
    assert kv.sum == by_source["local_compute"]
    assert "abort" in es.request_success_by_reason


def test_served_metrics_follow_the_accept_header(sim: RunningSim) -> None:
    om = httpx.get(f"{sim.url}/metrics", headers={"Accept": OM_ACCEPT})
    text = httpx.get(f"{sim.url}/metrics")
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert text.headers["content-type"].startswith("text/plain")
    # Prometheus lists OpenMetrics first but accepts text: it gets text, as from vLLM
    prom_accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                   "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # fmt: skip
    prom = httpx.get(f"{sim.url}/metrics", headers={"Accept": prom_accept})
    assert prom.headers["content-type"].startswith("text/plain")
    assert "vllm:num_requests_running" in prom.text
    assert om.text.endswith("# EOF\n")
    (es_om,) = parse_vllm_metrics(om.content, ts=1.0, replica="r")
    (es_text,) = parse_vllm_metrics(text.content, ts=1.0, replica="r")
    assert es_om.waiting_by_reason.keys() == es_text.waiting_by_reason.keys()
