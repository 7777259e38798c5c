"""Spans leave the simulator over real OTLP/HTTP (protobuf), as vLLM sends them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from slokit.lab.sim.background import running_cluster
from slokit.lab.sim.settings import SimSettings


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """A tiny OTLP/HTTP receiver on an ephemeral port."""
    got: list[ExportTraceServiceRequest] = []

    async def traces(request: web.Request) -> web.Response:
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(await request.read())
        got.append(msg)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[web.AppRunner, int]:
        app = web.Application()
        app.router.add_post("/v1/traces", traces)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    runner, port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    yield f"http://127.0.0.1:{port}", got
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_llm_request_span_is_exported_over_otlp_http(receiver: tuple[str, list]) -> None:
    endpoint, got = receiver
    settings = SimSettings(speed=20.0, otlp_endpoint=endpoint, otlp_protocol="http/protobuf")
    with running_cluster(settings, replicas=2) as sim:
        httpx.post(f"{sim.cluster.urls()[1]}/v1/completions", json={"prompt": "a b", "max_tokens": 3},
                   headers={"X-Request-Id": "r7"})  # fmt: skip
        sim.cluster.replicas[1].emitter.provider.force_flush()
    spans = [
        (rs, ss, s)
        for msg in got
        for rs in msg.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    assert len(spans) == 1
    rs, ss, span = spans[0]
    assert ss.scope.name == "vllm.tracing.otel" and span.name == "llm_request"
    res = {a.key: a.value.string_value for a in rs.resource.attributes}
    assert res["k8s.pod.name"] == "sim-vllm-1" and res["service.name"] == "vllm"
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["gen_ai.request.id"].string_value == "cmpl-r7-0"
    assert attrs["gen_ai.usage.completion_tokens"].int_value == 3
