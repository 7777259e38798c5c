"""What the PrometheusReader asks of Prometheus: a window's increases once however its end is
spelled, and answers uncompressed on the loopback interface."""

from __future__ import annotations

import json

import httpx
import pytest

from slokit.store.prometheus import PrometheusReader


def _empty(request: httpx.Request) -> httpx.Response:
    kind = "vector" if request.url.path.endswith("/query") else "matrix"
    body = {"status": "success", "data": {"resultType": kind, "result": []}}
    return httpx.Response(200, content=json.dumps(body))


def test_a_window_ending_a_microsecond_later_is_not_asked_again() -> None:
    # diagnose asks an episode's summary, then its impact over the same window with the
    # newest sample included (until + 1e-6): the same PromQL, answered once.
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _empty(request)

    with PrometheusReader("http://prom.example", transport=httpx.MockTransport(handler)) as r:
        r.request_summary("pod-1", 1000.0, 1600.0)
        asked = len(seen)
        r.request_summary("pod-1", 1000.0, 1600.000001)
        r.request_summaries(1000.0, 1600.0)
    assert asked > 0 and len(seen) == asked


@pytest.mark.parametrize(
    ("url", "encoding"),
    [("http://127.0.0.1:9090", "identity"), ("http://localhost:9090", "identity"),
     ("http://[::1]:9090", "identity"), ("http://prometheus.monitoring:9090", None)],
)  # fmt: skip
def test_answers_are_uncompressed_on_the_loopback_interface(url: str, encoding: str) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _empty(request)

    with PrometheusReader(url, transport=httpx.MockTransport(handler)) as r:
        r.request_summary(None, 0.0, 60.0)
    got = {req.headers.get("accept-encoding") for req in seen}
    assert got == {encoding} if encoding else "identity" not in got


def test_an_accept_encoding_header_given_is_kept() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _empty(request)

    with PrometheusReader("http://127.0.0.1:9090", headers={"Accept-Encoding": "gzip"},
                          transport=httpx.MockTransport(handler)) as r:  # fmt: skip
        r.request_summary(None, 0.0, 60.0)
    assert {req.headers["accept-encoding"] for req in seen} == {"gzip"}
