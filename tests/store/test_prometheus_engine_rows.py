"""The PrometheusReader's engine and GPU rows, built column-wise from a range query's series,
are the rows the scrape normalizers make of the same series (one scrape per timestamp and
pod, :func:`slokit.sources.prometheus.samples_from_series`), value for value and in order."""

from __future__ import annotations

import math
from typing import Any

import pytest

from slokit.sources.prometheus import Series, samples_from_series
from slokit.store._prom_rows import scrape_tables
from slokit.store.append import append_table
from slokit.store.db import Store, open_store

TS = [100.0, 110.0, 120.0]
BLANK = float(0x7FFFFFF0)


def _s(name: str, values: list[float], **labels: str) -> Series:
    return Series({"__name__": name, **labels}, list(zip(TS, values, strict=True)))


def _series() -> list[Series]:
    tiny = {"model_name": "tiny", "engine": "0"}
    return [
        # pod-a: current names, one value out of range, a NaN point, two engines
        _s("vllm:num_requests_running", [1, 2, math.nan], pod="pod-a", **tiny),
        _s("vllm:num_requests_waiting", [0, 30, 31], pod="pod-a", **tiny),
        _s("vllm:kv_cache_usage_perc", [0.5, 1.5, 0.9], pod="pod-a", **tiny),
        _s("vllm:num_requests_running", [3, 3, 3], pod="pod-a", model_name="tiny", engine="1"),
        _s("vllm:num_preemptions_total", [1, -1, math.inf], pod="pod-a", **tiny),
        # the old KV name where the new one is missing (another pod), escaped names
        _s("vllm_gpu_cache_usage_perc", [0.25, 0.3, 0.35], pod="pod-b", model_name="m"),
        _s("vllm_num_requests_running", [5, 6, 7], pod="pod-b", model_name="m"),
        _s("vllm:gpu_cache_usage_perc", [0.9, 0.9, 0.9], pod="pod-a", **tiny),
        # no model_name: no engine of its own, but its name is present in the scrape
        _s("vllm:kv_cache_usage_perc", [0.1, math.nan, 0.1], pod="pod-b"),
        # finished requests by reason; one implausible value makes the total unknown
        _s("vllm:request_success_total", [10, 11, 12], pod="pod-a", finished_reason="stop", **tiny),
        _s(
            "vllm:request_success_total",
            [1.5, -2, 3],
            pod="pod-a",
            finished_reason="length",
            **tiny,
        ),
        _s("vllm:request_success_total", [4, 4, 4], pod="pod-a", **tiny),
        _s("vllm:request_success_total", [7, 8, 9], pod="pod-c", model_name="only-success"),
        # KV geometry: one info for pod-a; two (by engine) for pod-b, one unparsable
        _s(
            "vllm:cache_config_info", [1, 1, 1], pod="pod-a", block_size="16", num_gpu_blocks="1000"
        ),
        _s(
            "vllm:cache_config_info",
            [1, 1, math.nan],
            pod="pod-b",
            engine="9",
            block_size="32",
            num_gpu_blocks="x",
        ),
        _s("vllm:cache_config_info", [1, 1, 1], pod="pod-b", block_size="8", num_gpu_blocks="5"),
        # no pod label: the instance, else "unknown"
        _s("vllm:num_requests_waiting", [2, 2, 2], instance="10.0.0.1:8000", model_name="m"),
        _s("vllm:num_requests_waiting", [4, 4, 4], model_name="m"),
        # DCGM: a blank, a percentage, energy in mJ, the framebuffer parts, MIG, no gpu label
        _s(
            "DCGM_FI_DEV_GPU_UTIL",
            [85, BLANK, 150],
            gpu="0",
            UUID="GPU-1",
            pod="pod-a",
            Hostname="node-1",
            modelName="H100",
        ),
        _s(
            "DCGM_FI_DEV_FB_USED",
            [70000, 70000, BLANK],
            gpu="0",
            UUID="GPU-1",
            pod="pod-a",
            Hostname="node-2",
        ),
        _s("DCGM_FI_DEV_FB_FREE", [9000, 9000, 9000], gpu="0", UUID="GPU-1", pod="pod-a"),
        _s("DCGM_FI_DEV_FB_RESERVED", [500, math.nan, 500], gpu="0", UUID="GPU-1", pod="pod-a"),
        _s(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            [5e6, 6e6, 7e6],
            gpu="0",
            uuid="GPU-1",
            pod="pod-a",
        ),
        _s(
            "DCGM_FI_DEV_POWER_USAGE",
            [300, 310, 320],
            gpu="1",
            GPU_I_ID="3",
            pod="pod-b",
            namespace="ns",
            hostname="node-3",
        ),
        _s("DCGM_FI_DEV_GPU_TEMP", [60, 61, 62], UUID="GPU-9", pod="pod-b"),
        _s("DCGM_FI_DEV_SM_CLOCK", [1980, 1900, 1800], gpu="0", UUID="GPU-1", pod="pod-a"),
    ]


def _rows(store: Store, table: str) -> list[Any]:
    with store.transaction() as con:
        return con.execute(f"SELECT * FROM {table}").fetchall()


def _parsed(series: list[Series], label: str) -> Store:
    store = open_store(":memory:")
    engine, gpu = samples_from_series(series, label)
    store.append_engine_samples(engine)
    store.append_gpu_samples(gpu)
    return store


def _built(series: list[Series], label: str) -> Store:
    store = open_store(":memory:")
    engine, gpu = scrape_tables(series, label)
    append_table(store, "engine_samples", engine)
    append_table(store, "gpu_samples", gpu)
    return store


@pytest.mark.parametrize("table", ["engine_samples", "gpu_samples"])
@pytest.mark.parametrize("label", ["pod", "instance"])
def test_rows_equal_the_normalizers_rows(table: str, label: str) -> None:
    series = _series()
    want = _rows(_parsed(series, label), table)
    assert want  # the case says something
    assert _rows(_built(series, label), table) == want


def test_series_order_decides_which_value_is_kept() -> None:
    series = _series()[::-1]
    for table in ("engine_samples", "gpu_samples"):
        assert _rows(_built(series, "pod"), table) == _rows(_parsed(series, "pod"), table)


def test_no_series_no_rows() -> None:
    engine, gpu = scrape_tables([], "pod")
    assert engine.num_rows == 0 and gpu.num_rows == 0
