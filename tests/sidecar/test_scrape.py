"""Scrape loops against a real in-test /metrics target serving the vLLM 0.32 capture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from sidecar_harness import (
    StartSidecar,
    TargetServer,
    closed_port_url,
    post,
    request_ids,
    scrape_failures,
    store_rows,
    wait_for,
)


def test_healthy_target_is_scraped_into_engine_samples(
    start_sidecar: StartSidecar, target: TargetServer
) -> None:
    # 1 s scrapes (a 0.8 s timeout): a busy machine must not turn a healthy target into gaps
    sc = start_sidecar(vllm_urls=(target.url,), scrape_interval_s=1.0)
    wait_for(
        lambda: store_rows(sc, "SELECT count(*) FROM engine_samples")[0][0] >= 2, what="samples"
    )
    assert sc.value("slokit_scrape_up", target=target.url, kind="vllm", replica="test-pod") == 1
    (replica, model, preemptions), *_ = store_rows(
        sc, "SELECT replica, model, preemptions_total FROM engine_samples"
    )
    assert (replica, model, preemptions) == ("test-pod", "tiny", 33.0)
    assert store_rows(sc, "SELECT bool_and(up) FROM scrapes") == [(True,)]


def test_down_target_is_counted_up_0_and_breaks_nothing_else(
    start_sidecar: StartSidecar, target: TargetServer, export_body: bytes
) -> None:
    down = closed_port_url()
    sc = start_sidecar(vllm_urls=(f"a={down}", f"b={target.url}"), scrape_interval_s=0.2)
    wait_for(lambda: scrape_failures(sc, down, "down") >= 2, what="counted failures")
    assert sc.value("slokit_scrape_up", target=down, kind="vllm", replica="a") == 0
    assert sc.value("slokit_scrape_up", target=target.url, kind="vllm", replica="b") == 1
    gap_sql = f"SELECT up, error FROM scrapes WHERE target = '{down}'"
    wait_for(lambda: len(store_rows(sc, gap_sql)) >= 2, what="gaps recorded")
    gaps = store_rows(sc, gap_sql)
    assert all(not up and error.startswith("down") for up, error in gaps)
    assert store_rows(sc, "SELECT DISTINCT replica FROM engine_samples") == [("b",)]
    assert post(sc.otlp, export_body).status_code == 200
    assert "r0" in request_ids(sc)
    assert httpx.get(f"{sc.api}/readyz").status_code == 200


def test_slow_target_times_out_below_the_interval_and_is_dropped(
    start_sidecar: StartSidecar, target: TargetServer
) -> None:
    target.mode = "slow"
    sc = start_sidecar(vllm_urls=(target.url,), scrape_interval_s=0.3)
    assert sc.sidecar.config.timeout_s < 0.3
    wait_for(lambda: scrape_failures(sc, target.url, "timeout") >= 1, what="timeout")
    assert sc.value("slokit_scrape_up", target=target.url, kind="vllm", replica="test-pod") == 0
    assert sc.value("slokit_scrape_duration_seconds", target=target.url, kind="vllm") < 0.3
    assert store_rows(sc, "SELECT count(*) FROM engine_samples") == [(0,)]


def test_garbage_is_dropped_whole(start_sidecar: StartSidecar, target: TargetServer) -> None:
    target.mode = "garbage"
    sc = start_sidecar(vllm_urls=(target.url,), scrape_interval_s=0.2)
    wait_for(lambda: scrape_failures(sc, target.url, "garbage") >= 1, what="garbage counted")
    assert sc.value("slokit_scrape_up", target=target.url, kind="vllm", replica="test-pod") == 0
    assert store_rows(sc, "SELECT count(*) FROM engine_samples") == [(0,)]


def test_http_error_status_is_dropped(start_sidecar: StartSidecar, target: TargetServer) -> None:
    target.mode = "error"
    sc = start_sidecar(vllm_urls=(target.url,), scrape_interval_s=0.2)
    wait_for(lambda: scrape_failures(sc, target.url, "http_status") >= 1, what="HTTP 500 counted")
    assert store_rows(sc, "SELECT count(*) FROM engine_samples") == [(0,)]


def test_restarted_target_is_a_counted_counter_reset_and_its_samples_are_kept(
    start_sidecar: StartSidecar, target: TargetServer
) -> None:
    sc = start_sidecar(vllm_urls=(target.url,), scrape_interval_s=0.2)
    wait_for(lambda: target.hits >= 1, what="first scrape")
    target.mode = "restarted"  # counters fall back to a fresh server's
    wait_for(lambda: sc.value("slokit_counter_resets_total", target=target.url) >= 1,
             what="reset counted")  # fmt: skip
    wait_for(lambda: store_rows(sc, "SELECT count(*) FROM scrapes WHERE error = 'counter reset'")[0][0]
             >= 1, what="reset recorded")  # fmt: skip
    assert sc.value("slokit_counter_resets_total", target=target.url) == 1
    assert store_rows(sc, "SELECT min(preemptions_total) FROM engine_samples") == [(0.0,)]


def test_dcgm_target_is_scraped_into_gpu_samples_of_the_pod(
    start_sidecar: StartSidecar, target: TargetServer
) -> None:
    target.body = (
        Path(__file__).parents[1] / "sources" / "data" / "dcgm_two_gpus.prom"
    ).read_bytes()
    sc = start_sidecar(dcgm_urls=(target.url,), scrape_interval_s=0.2)
    wait_for(
        lambda: store_rows(sc, "SELECT count(*) FROM gpu_samples")[0][0] >= 2, what="gpu samples"
    )
    assert sc.value("slokit_scrape_up", target=target.url, kind="dcgm", replica="test-pod") == 1
    assert store_rows(
        sc, "SELECT count(DISTINCT gpu), bool_and(replica IS NOT NULL) FROM gpu_samples"
    ) == [(2, True)]


def test_nvml_without_a_gpu_is_a_state_not_a_crash(start_sidecar: StartSidecar) -> None:
    from slokit.sources.nvml import NvmlPoller

    def no_pynvml() -> Any:
        raise ImportError("No module named 'pynvml'")

    poller = NvmlPoller(importer=no_pynvml, replica="test-pod")
    sc = start_sidecar(nvml=True, scrape_interval_s=0.2, nvml_poller=poller)
    wait_for(lambda: store_rows(sc, "SELECT count(*) FROM scrapes WHERE kind = 'nvml'")[0][0] >= 1,
             what="nvml health row")  # fmt: skip
    assert sc.value("slokit_scrape_up", target="nvml", kind="nvml", replica="test-pod") == 0
    (error,) = store_rows(sc, "SELECT any_value(error) FROM scrapes WHERE kind = 'nvml'")[0]
    assert "pynvml is not installed" in error
    assert httpx.get(f"{sc.api}/readyz").status_code == 200


def test_gpu_cost_accrues_while_the_replica_is_up(
    start_sidecar: StartSidecar, target: TargetServer
) -> None:
    slo = Path(__file__).parents[2] / "examples" / "slo" / "chat.yaml"  # 4 USD per GPU hour
    sc = start_sidecar(vllm_urls=(target.url,), scrape_interval_s=0.2, slo=str(slo))
    wait_for(lambda: target.hits >= 3, what="three scrapes")
    cost = sc.value("slokit_gpu_cost_usd_total", replica="test-pod")
    assert cost >= 2 * 0.2 * 4.0 / 3600
