"""Metric history files (OpenMetrics with timestamps, Prometheus text) -> engine/GPU samples."""

from __future__ import annotations

import pytest

from slokit.errors import BadInput
from slokit.sources.files import parse_metrics_file


@pytest.fixture(scope="module")
def history(data_dir) -> str:
    return (data_dir / "history_two_replicas.om").read_text()


def test_history_gives_one_engine_sample_per_timestamp_and_instance(history):
    recs = parse_metrics_file(history, name="h.om")
    got = {(e.ts, e.replica): e.running for e in recs.engine_samples}
    assert got == {
        (1795958400.0, "vllm-0:8000"): 4.0,
        (1795958415.0, "vllm-0:8000"): 8.0,
        (1795958400.0, "vllm-1:8000"): 1.0,
        (1795958415.0, "vllm-1:8000"): 0.0,
    }


def test_history_histograms_are_rebuilt_per_timestamp(history):
    recs = parse_metrics_file(history, name="h.om")
    snaps = {
        e.ts: e.histograms["ttft_s"] for e in recs.engine_samples if e.replica == "vllm-0:8000"
    }
    assert snaps[1795958400.0].cumulative_counts == [10.0, 19.0, 20.0]
    assert (snaps[1795958415.0].count, snaps[1795958415.0].sum) == (30.0, 9.25)
    assert snaps[1795958415.0].upper_bounds == [0.1, 1.0, float("inf")]


def test_a_counter_that_went_down_is_kept_raw(history):
    recs = parse_metrics_file(history, name="h.om")
    got = sorted(
        (e.ts, e.preemptions_total) for e in recs.engine_samples if e.replica == "vllm-0:8000"
    )
    assert got == [(1795958400.0, 30.0), (1795958415.0, 2.0)]


def test_history_gpu_samples_per_timestamp(history):
    recs = parse_metrics_file(history, name="h.om")
    got = sorted((g.ts, g.util_ratio, g.replica, g.node) for g in recs.gpu_samples)
    assert got == [
        (1795958400.0, 0.88, "vllm-0", "gpu-node-7"),
        (1795958415.0, 0.91, "vllm-0", "gpu-node-7"),
    ]


def test_instance_argument_names_the_replica_when_the_label_is_missing():
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="m"} 5 1700000000\n# EOF\n'
    )
    (es,) = parse_metrics_file(text, name="f.om", instance="pod-a").engine_samples
    assert (es.replica, es.ts, es.waiting) == ("pod-a", 1700000000.0, 5.0)


def test_instance_label_wins_over_the_argument():
    text = 'vllm:num_requests_waiting{instance="x",model_name="m"} 5 1700000000\n# EOF\n'
    (es,) = parse_metrics_file(text, name="f.om", instance="pod-a").engine_samples
    assert es.replica == "x"


def test_no_instance_anywhere_is_badinput():
    text = 'vllm:num_requests_waiting{model_name="m"} 5 1700000000\n# EOF\n'
    with pytest.raises(BadInput, match=r"^f\.om: .*instance"):
        parse_metrics_file(text, name="f.om")


def test_classic_text_with_millisecond_timestamps():
    text = 'vllm:num_requests_waiting{model_name="m"} 5 1795958400123\n'
    (es,) = parse_metrics_file(text, name="f.prom", instance="r").engine_samples
    assert es.ts == pytest.approx(1795958400.123)


def test_a_saved_scrape_without_timestamps_takes_default_ts(vllm_after_load):
    recs = parse_metrics_file(
        vllm_after_load, name="after.prom", instance="r0", default_ts=1_700_000_007.0
    )
    (es,) = recs.engine_samples
    assert (es.ts, es.replica, es.preemptions_total) == (1_700_000_007.0, "r0", 33.0)


def test_a_saved_scrape_without_timestamps_and_no_default_is_badinput(vllm_after_load):
    with pytest.raises(BadInput, match="no timestamp"):
        parse_metrics_file(vllm_after_load, name="after.prom", instance="r0")


def test_bad_line_names_file_and_line_and_nothing_is_returned(history):
    lines = history.splitlines()
    lines[5] = "vllm:num_requests_running{oops 1 2"
    with pytest.raises(BadInput, match=r"^h\.om: line 6: "):
        parse_metrics_file("\n".join(lines) + "\n", name="h.om")


def test_invalid_utf8_names_file_and_line():
    with pytest.raises(BadInput, match=r"^f\.om:2: invalid UTF-8"):
        parse_metrics_file(b'a 1 5\nb{x="\xfe"} 1 5\n# EOF\n', name="f.om", instance="r")
