"""The router's exposition (llm-d router / Inference Extension EPP) -> RouterSample."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from slokit.records import RouterSample
from slokit.sources.exposition import parse_exposition
from slokit.sources.router_metrics import (
    is_router_exposition,
    known_families,
    parse_router_metrics,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "router"
FILES = sorted(FIXTURES.glob("*.prom"))


def _by_model(name: str) -> dict[str | None, RouterSample]:
    samples = parse_router_metrics((FIXTURES / name).read_text(), ts=10.0, router="epp")
    return {s.model: s for s in samples}


def test_there_are_fixtures() -> None:
    assert {p.name for p in FILES} == {
        "llm_d_epp.prom",
        "gateway_api_inference_extension.prom",
        "inference_model_legacy.prom",
    }


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_documented_family_is_known(path: Path) -> None:
    families = parse_exposition(path.read_text())
    names = {f.name for f in families}
    assert names - known_families() == set()
    assert is_router_exposition(families)


def test_current_names_are_read_and_deprecated_twins_not_counted_twice() -> None:
    got = _by_model("llm_d_epp.prom")
    pool, model = got[None], got["llama-8b"]
    assert pool.pool == model.pool == "vllm-llama-pool"
    assert pool.pool_saturation == 1.05  # stage effective
    assert pool.avg_kv_usage_ratio == 0.42
    assert pool.avg_queue_size == 0.5 and pool.ready_endpoints == 2
    assert pool.flow_outcomes == {"Dispatched": 1480, "RejectedCapacity": 12}
    assert model.flow_queue_size == 37 and model.flow_queue_bytes == 61440
    assert model.requests_total == 1500 and model.running == 24
    assert model.errors_total == 15
    assert model.errors_by_code == {"ResourceExhausted": 12, "ServiceUnavailable": 3}
    hists = model.histograms
    assert set(hists) == {"ttft_s", "tpot_s", "e2e_s", "flow_queue_s"}
    assert hists["ttft_s"].count == 1500 and hists["flow_queue_s"].count == 1480


def test_deprecated_names_are_the_fallback() -> None:
    got = _by_model("gateway_api_inference_extension.prom")
    assert got[None].avg_kv_usage_ratio == 0.97
    assert got[None].avg_queue_size == 14 and got[None].ready_endpoints == 3
    m = got["llama-8b"]
    assert (m.requests_total, m.errors_total, m.running) == (900, 4, 9)
    assert m.flow_queue_size == 0
    assert set(m.histograms) == {"e2e_s", "flow_queue_s"}
    legacy = _by_model("inference_model_legacy.prom")
    assert legacy["llama-8b"].requests_total == 50
    assert legacy["llama-8b"].errors_by_code == {"Internal": 2}


def test_a_value_out_of_range_is_a_missing_fact() -> None:
    text = (
        "# TYPE llm_d_epp_average_kv_cache_utilization gauge\n"
        'llm_d_epp_average_kv_cache_utilization{name="p"} NaN\n'
        "# TYPE llm_d_epp_flow_control_queue_size gauge\n"
        'llm_d_epp_flow_control_queue_size{inference_pool="p",model_name="m"} -1\n'
    )
    invalid: Counter[str] = Counter()
    got = {s.model: s for s in parse_router_metrics(text, ts=1.0, router="r", invalid=invalid)}
    assert got[None].avg_kv_usage_ratio is None and got["m"].flow_queue_size is None
    assert invalid == Counter({"avg_kv_usage_ratio": 1, "flow_queue_size": 1})


def test_a_vllm_exposition_is_not_a_router_one() -> None:
    text = '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} 1\n'
    assert not is_router_exposition(parse_exposition(text))


def test_ingest_metrics_recognises_a_router_scrape() -> None:
    from slokit.ingest import ingest_metrics
    from slokit.store.db import open_store

    with open_store(":memory:") as store:
        report = ingest_metrics(store, [FIXTURES / "llm_d_epp.prom"], default_ts=1.7e9)
        assert report.ok and report.router_samples == 2
        frame = store.reader().router_buckets(1.7e9 - 10, 1.7e9 + 10, 10.0)
    assert frame["queue_max"].max() == 37 and frame["replica"].unique().tolist() == ["llm_d_epp"]
