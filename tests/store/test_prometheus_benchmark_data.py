"""The data of ``benchmarks/diagnose_prometheus.py`` can show its planted incident through
Prometheus: every pod has enough requests per 10 s bucket for request rows built from vLLM's
histograms, and pod-7's requests queue in the second half (queue time and TTFT up, TPOT
flat), which is what ``queue_saturation`` looks for."""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from slokit.analysis.rules._context import DiagnoseOptions

BENCH = Path(__file__).resolve().parents[2] / "benchmarks/diagnose_prometheus.py"
STEPS = 360  # one hour of 10 s scrapes, as the benchmark writes it
LINE = re.compile(r"^(?P<name>[^{]+)\{(?P<labels>.*)\} (?P<value>\S+) (?P<ts>\S+)$")


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("diagnose_prometheus_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.fixture(scope="module")
def series(bench: ModuleType) -> dict[tuple[str, str], list[float]]:
    """``(name, pod) -> values`` over the hour, of the sums and counts of the histograms."""
    wanted = ("_count", "_sum")
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for line in bench.openmetrics(bench.INCIDENT_POD + 1, STEPS):
        m = LINE.match(line)
        if m and m["name"].endswith(wanted):
            pod = re.search(r'pod="([^"]+)"', m["labels"])
            assert pod is not None
            out[(m["name"], pod[1])].append(float(m["value"]))
    return out


def _per_step(values: list[float], steps: slice) -> list[float]:
    return [b - a for a, b in itertools.pairwise(values)][steps]


def test_every_pod_has_enough_requests_per_bucket_for_request_rows(
    bench: ModuleType, series: dict[tuple[str, str], list[float]]
) -> None:
    least = DiagnoseOptions().min_bucket_requests
    for pod in range(bench.INCIDENT_POD + 1):
        ttft = series[("vllm:time_to_first_token_seconds_count", f"pod-{pod}")]
        assert min(_per_step(ttft, slice(None))) >= least


def test_the_incident_pod_queues_its_requests_in_the_second_half(
    bench: ModuleType, series: dict[tuple[str, str], list[float]]
) -> None:
    half = STEPS // 2
    pod = f"pod-{bench.INCIDENT_POD}"

    def mean(family: str, steps: slice) -> float:
        sums = sum(_per_step(series[(f"vllm:{family}_sum", pod)], steps))
        return sums / sum(_per_step(series[(f"vllm:{family}_count", pod)], steps))

    before, after = slice(0, half - 1), slice(half, None)
    queue = mean("request_queue_time_seconds", after) - mean("request_queue_time_seconds", before)
    assert queue >= bench.QUEUE_S * 0.99
    ttft = mean("time_to_first_token_seconds", after) / mean("time_to_first_token_seconds", before)
    assert ttft > DiagnoseOptions().ttft_factor
    tpot = "request_time_per_output_token_seconds"
    assert mean(tpot, after) == pytest.approx(mean(tpot, before))
