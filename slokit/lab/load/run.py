"""One load run end to end (:func:`run_load`): session, model, schedule, runner, summary."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import TYPE_CHECKING

import aiohttp

from slokit.lab.load.clock import Clock, SystemClock
from slokit.lab.load.config import LoadConfig
from slokit.lab.load.records import RecordWriter
from slokit.lab.load.runner import Runner
from slokit.lab.load.schedule import make_schedule
from slokit.lab.load.stats import LoadResult, ProgressCallback, summarize
from slokit.lab.load.tracing import ClientTracer, otlp_http_exporter
from slokit.lab.load.urls import discover_model

#: How long an idle connection may be reused: under the 5 s after which vLLM's server
#: (uvicorn, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) closes one. A client that keeps connections
#: longer sends, now and then, a request on a connection the server is closing at that moment,
#: which fails (``ServerDisconnectedError``) without ever reaching vLLM; the slower the
#: client's loop (a busy machine), the more often.
KEEPALIVE_S = 4.0

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter


async def run_load(
    config: LoadConfig,
    *,
    connector: aiohttp.BaseConnector | None = None,
    clock: Clock | None = None,
    span_exporter: SpanExporter | None = None,
    on_progress: ProgressCallback | None = None,
) -> LoadResult:
    """Run one load test and return its summary (and records, when ``keep_records``).

    ``connector`` replaces how connections are made (any aiohttp connector, e.g. a
    ``UnixConnector`` or a ``TCPConnector`` with its own resolver; the caller closes it),
    ``clock`` the time source, ``span_exporter`` the OTLP exporter (any OpenTelemetry ``SpanExporter``; spans
    are then exported synchronously, one per request).
    """
    config.validate()
    clock = clock or SystemClock()
    rng = random.Random(config.seed)
    tracer: ClientTracer | None = None
    if span_exporter is not None:
        tracer = ClientTracer(span_exporter, batch=False)
    elif config.otlp_endpoint:
        tracer = ClientTracer(otlp_http_exporter(config.otlp_endpoint), batch=True)
    writer = RecordWriter(config.out) if config.out is not None else None
    try:
        if connector is None:
            # aiohttp rather than httpx: streaming 16-token responses at 200 req/s, httpx cost
            # 3-7 ms of CPU per request (httpcore scans its whole pool on every request and
            # retries a failing import of sniffio each time), aiohttp about 0.8 ms.
            # Unbounded in the open loop (a send never queues behind a busy connection); one
            # connection per user in the closed loop.
            connector = aiohttp.TCPConnector(
                limit=config.users or 0, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
            )
            owner = True
        else:
            owner = False
        async with aiohttp.ClientSession(
            connector=connector,
            connector_owner=owner,
            timeout=aiohttp.ClientTimeout(total=None),  # the runner times each request
        ) as session:
            model = (
                config.model or config.workload.model or await discover_model(session, config.url)
            )
            runner = Runner(config, session, clock, model, tracer, writer)
            sampler = config.workload.sampler(rng, runner.run_id)
            schedule: list[float] = []
            if config.rate is not None:
                schedule = make_schedule(config.arrival, config.rate, config.duration_s, rng)
            start = clock.now()
            progress = (
                asyncio.create_task(runner.report_progress(start, on_progress))
                if on_progress is not None
                else None
            )
            try:
                if config.rate is not None:
                    await runner.open_loop(start, schedule, sampler.next)
                else:
                    await runner.closed_loop(start, sampler.next)
            finally:
                if progress is not None:
                    progress.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await progress
            scheduled = len(schedule) if config.rate else runner.stats.sent
            summary = summarize(runner.stats, config, runner.run_id, start, scheduled)
            return LoadResult(summary=summary, records=runner.records)
    finally:
        if writer is not None:
            writer.close()
        if tracer is not None:
            await asyncio.to_thread(tracer.shutdown)
