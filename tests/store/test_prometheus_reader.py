"""PrometheusReader without a server: headers and auth on every call, errors naming the URL,
and the histogram arithmetic (Prometheus' ``histogram_quantile``)."""

from __future__ import annotations

import math

import httpx
import pytest
from click.testing import CliRunner

from slokit.cli import main
from slokit.errors import BadInput
from slokit.store import _promql as pq
from slokit.store.prometheus import PrometheusReader


def _answer(request: httpx.Request) -> httpx.Response:
    if request.url.params.get("query") == "time()":
        return httpx.Response(200, json={"status": "success",
                                         "data": {"resultType": "scalar", "result": [100, "100"]}})  # fmt: skip
    return httpx.Response(200, json={"status": "success",
                                     "data": {"resultType": "matrix", "result": []}})  # fmt: skip


def test_headers_and_basic_auth_reach_every_call() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _answer(request)

    with PrometheusReader(
        "http://prom.example:9090", headers={"X-Scope-OrgID": "team-a",
                                             "Authorization": "Bearer tok"},
        transport=httpx.MockTransport(handler),
    ) as reader:  # fmt: skip
        assert reader.basis == "histograms"
        assert reader.bounds() == (None, None)
    assert len(seen) >= 2
    assert all(r.headers["X-Scope-OrgID"] == "team-a" for r in seen)
    assert all(r.headers["Authorization"] == "Bearer tok" for r in seen)

    seen.clear()
    with PrometheusReader("http://prom.example", basic_auth=("u", "p"),
                          transport=httpx.MockTransport(handler)) as reader:  # fmt: skip
        reader.bounds()
    assert seen and all(r.headers["Authorization"].startswith("Basic ") for r in seen)


@pytest.mark.parametrize(
    "response",
    [httpx.Response(503, text="down"), httpx.Response(200, text="<html>"),
     httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "parse"})],
)  # fmt: skip
def test_bad_answers_are_bad_input_naming_the_url(response: httpx.Response) -> None:
    mock = httpx.MockTransport(lambda r: response)
    with (
        PrometheusReader("http://prom.example", transport=mock) as reader,
        pytest.raises(BadInput, match=r"prom\.example"),
    ):
        reader.bounds()


def test_no_per_request_records() -> None:
    with PrometheusReader("http://x", transport=httpx.MockTransport(_answer)) as reader:
        assert reader.request("r1") is None
        assert reader.requests(None, None) == []
        assert reader.slowest_request() is None
        assert reader.findings(None, None) == []


def test_unreachable_url_exits_2_with_one_line() -> None:
    res = CliRunner().invoke(main, ["diagnose", "--prometheus", "http://127.0.0.1:9"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "127.0.0.1:9" in lines[0]


def test_hist_quantile_matches_prometheus() -> None:
    b = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0)]
    assert pq.hist_quantile(0.5, b) == pytest.approx(0.1 + 0.4 * (20 - 10) / 20)
    assert pq.hist_quantile(0.25, b) == pytest.approx(0.1)
    assert pq.hist_quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)]) == 1.0
    assert pq.hist_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None
    sd = pq.hist_sd([(1.0, 2.0), (2.0, 4.0), (math.inf, 4.0)], 1.0)
    assert sd == pytest.approx(math.sqrt((2 * 0.25 + 2 * 0.25) / 3))


def test_a_vllm_selector_also_matches_the_names_openmetrics_escaping_stores() -> None:
    # prometheus_client answers an OpenMetrics scrape with vllm_x for vllm:x (0.26).
    from slokit.sources.prometheus import vllm_name
    from slokit.store._promql import series

    assert series("vllm:x_bucket") == '{__name__=~"vllm[:_]x_bucket"}'
    assert series('vllm:x{le="1"}') == '{__name__=~"vllm[:_]x", le="1"}'
    assert (
        series('slokit_requests_total{outcome="error"}') == 'slokit_requests_total{outcome="error"}'
    )
    assert vllm_name("vllm_num_requests_running") == "vllm:num_requests_running"
    assert vllm_name("DCGM_FI_DEV_GPU_UTIL") == "DCGM_FI_DEV_GPU_UTIL"
