"""TPOT's quantile per pod and bucket is ``A or B or C`` (the first of vLLM's TPOT histograms a
pod has); the reader asks Prometheus for a later histogram only for the pods an earlier one
leaves without a value, and merges the answers as ``or`` does."""

from __future__ import annotations

import json
from typing import Any

import httpx

from slokit.sources.prometheus import PrometheusClient
from slokit.store import _histograms as hist
from slokit.store import _promql as pq

A, B, C = pq.TPOT  # request_time_per_output_token, time_per_output_token, inter_token_latency


def _family(query: str) -> str:
    return next(f for f in (A, B, C) if f[5:] + "_bucket" in query)


class FakePrometheus:
    """Quantiles and presence per family, as a Prometheus holding them would answer."""

    def __init__(self, quantiles: dict[str, dict[str, dict[float, float]]]) -> None:
        self.quantiles = quantiles  # family -> pod -> time -> value
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        self.asked.append(query)
        pods = self.quantiles.get(_family(query), {})
        if "count_over_time" in query:  # which pods have the family
            result: list[dict[str, Any]] = [{"metric": {"pod": p}, "value": [30, "1"]}
                                            for p in pods]  # fmt: skip
            return _answer("vector", result)
        narrowed = "pod=~" in query  # to the pods named (escaped as RE2 in PromQL)
        result = [{"metric": {"pod": p}, "values": [[t, repr(v)] for t, v in sorted(at.items())]}
                  for p, at in sorted(pods.items())
                  if not narrowed or p.replace("-", "\\\\-") in query]  # fmt: skip
        return _answer("matrix", result)


def _answer(kind: str, result: list[dict[str, Any]]) -> httpx.Response:
    body = {"status": "success", "data": {"resultType": kind, "result": result}}
    return httpx.Response(200, content=json.dumps(body))


def _tpot(fake: FakePrometheus) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    client = PrometheusClient("http://prom.example", client=httpx.Client(
        transport=httpx.MockTransport(fake)))  # fmt: skip
    grid = hist._Grid(0.0, 30.0, 10.0)  # buckets end at 10, 20, 30
    return [(s.labels, s.points) for s in grid.first_quantile(client, "pod", 0.5, pq.TPOT)()]


def test_a_later_histogram_fills_only_the_buckets_an_earlier_one_leaves() -> None:
    fake = FakePrometheus({
        A: {"pod-a": {10: 1.0, 20: 1.0, 30: 1.0}, "pod-b": {10: 2.0}},
        B: {"pod-a": {10: 9.0, 20: 9.0, 30: 9.0}, "pod-b": {10: 9.0, 20: 3.0}},
        C: {"pod-c": {20: 4.0, 30: 4.0}, "pod-b": {10: 9.0, 20: 9.0, 30: 5.0}},
    })  # fmt: skip
    assert _tpot(fake) == [
        ({"pod": "pod-a"}, [(10.0, 1.0), (20.0, 1.0), (30.0, 1.0)]),
        ({"pod": "pod-b"}, [(10.0, 2.0), (20.0, 3.0), (30.0, 5.0)]),
        ({"pod": "pod-c"}, [(20.0, 4.0), (30.0, 4.0)]),
    ]


def test_later_histograms_are_read_only_for_the_pods_that_need_them() -> None:
    fake = FakePrometheus({
        A: {"pod-a": {10: 1.0, 20: 1.0, 30: 1.0}, "pod-b": {10: 2.0}},
        B: {"pod-a": {10: 9.0, 20: 9.0, 30: 9.0}, "pod-b": {20: 3.0}},
    })  # fmt: skip
    _tpot(fake)
    asked_b = [q for q in fake.asked if "histogram_quantile" in q and _family(q) == B]
    assert len(asked_b) == 1 and 'pod=~"pod\\\\-b"' in asked_b[0]


def test_a_fleet_with_the_first_histogram_everywhere_reads_no_other() -> None:
    fake = FakePrometheus({
        A: {"pod-a": {10: 1.0, 20: 1.0, 30: 1.0}},
        C: {"pod-a": {10: 9.0, 20: 9.0, 30: 9.0}},
    })  # fmt: skip
    assert _tpot(fake) == [({"pod": "pod-a"}, [(10.0, 1.0), (20.0, 1.0), (30.0, 1.0)])]
    assert [_family(q) for q in fake.asked if "histogram_quantile" in q] == [A]
