"""Forwarding: received bodies go upstream byte for byte; a dead upstream never blocks ingest."""

from __future__ import annotations

import gzip

import httpx
from sidecar_harness import StartSidecar, closed_port_url, post, relabel, request_ids, wait_for


def test_bodies_are_forwarded_unchanged(start_sidecar: StartSidecar, export_body: bytes) -> None:
    seen: list[tuple[str, bytes, str | None]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), request.content, request.headers.get("Content-Encoding")))
        return httpx.Response(200)

    sc = start_sidecar(forward_otlp="http://collector:4318",
                       forward_transport=httpx.MockTransport(upstream))  # fmt: skip
    body = gzip.compress(relabel(export_body, "fwd")[0])
    assert post(sc.otlp, body, **{"Content-Encoding": "gzip"}).status_code == 200
    wait_for(lambda: len(seen) == 1, what="forwarded body")
    assert seen == [("http://collector:4318/v1/traces", body, "gzip")]


def test_a_dead_upstream_is_counted_and_never_blocks_ingest(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(forward_otlp=closed_port_url().replace("/metrics", "/v1/traces"))
    for i in range(3):
        body, ids = relabel(export_body, f"dead{i}")
        assert post(sc.otlp, body).status_code == 200
        assert set(ids) <= request_ids(sc)
    wait_for(lambda: sc.value("slokit_dropped_total", reason="forward_failed") == 3,
             what="3 failed forwards counted")  # fmt: skip


def test_an_export_is_forwarded_as_what_it_was_read_as_not_under_its_header(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    """A Content-Type's parameters may be any bytes (here not ASCII): they once stopped the
    forwarder for good, silently, at the first such export."""
    seen: list[str | None] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Content-Type"))
        return httpx.Response(200)

    sc = start_sidecar(forward_otlp="http://collector:4318",
                       forward_transport=httpx.MockTransport(upstream))  # fmt: skip
    odd = "application/x-protobuf; q=\u00e9".encode()
    first = httpx.post(sc.otlp, content=relabel(export_body, "odd")[0],
                       headers={"Content-Type": odd}, timeout=30)  # fmt: skip
    assert first.status_code == 200
    assert post(sc.otlp, relabel(export_body, "next")[0]).status_code == 200
    wait_for(lambda: len(seen) == 2, what="both exports forwarded")
    assert seen == ["application/x-protobuf", "application/x-protobuf"]


def test_a_failure_of_any_kind_costs_the_forwarder_one_export(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    calls: list[int] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in a transport, say")
        return httpx.Response(200)

    sc = start_sidecar(forward_otlp="http://collector:4318",
                       forward_transport=httpx.MockTransport(upstream))  # fmt: skip
    assert post(sc.otlp, relabel(export_body, "any0")[0]).status_code == 200
    wait_for(lambda: sc.value("slokit_dropped_total", reason="forward_failed") == 1,
             what="the failed forward counted")  # fmt: skip
    assert post(sc.otlp, relabel(export_body, "any1")[0]).status_code == 200
    wait_for(lambda: len(calls) == 2, what="the next export forwarded")
