"""One simulated vLLM replica: its engine, GPU, faults and lifecycle, without the HTTP routes.

A :class:`Replica` owns one engine task (:class:`~slokit.lab.sim.engine.EngineLoop`) with its
listeners (vLLM metrics, the GPU model, spans), the fault knobs, and its two servers (built by
:mod:`slokit.lab.sim.routes`). :meth:`Replica.admit` is the front of the request path shared
by the HTTP routes and :meth:`Replica.generate_in_process`: validation, trace context,
injected errors and the frontend queue, in that order. ``crash`` takes the port down and
brings the replica back with a fresh engine (counters reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from slokit.lab.sim.clock import Clock, WallClock
from slokit.lab.sim.dcgm import GpuModel
from slokit.lab.sim.engine import EngineCore, EngineLoop, SimRequest, StepStats
from slokit.lab.sim.faults import Faults, apply_update
from slokit.lab.sim.metrics import VllmMetrics
from slokit.lab.sim.openai_wire import ApiError, RequestMeta, engine_dead, parse_request
from slokit.lab.sim.roofline import Roofline
from slokit.lab.sim.routes import dcgm_app, serve, vllm_app
from slokit.lab.sim.settings import SimSettings

if TYPE_CHECKING:
    from slokit.lab.sim.tracing import SpanEmitter


class _TraceListener:
    """Emits the ``llm_request`` span of every request that finished normally."""

    def __init__(self, emitter: SpanEmitter):
        self.emitter = emitter

    def on_step(self, stats: StepStats) -> None:
        return None

    def on_finish(self, req: SimRequest) -> None:
        meta = req.meta
        if isinstance(meta, RequestMeta) and req.finish_reason in ("length", "stop"):
            self.emitter.emit(req, meta.span_id, meta.parent)


class _StopStringListener:
    """A stop string that completes at the last allowed token finishes with ``stop``, not
    ``length`` (vLLM checks stop strings after the length limit). Must be the first listener,
    so that metrics and spans see the corrected reason."""

    def on_step(self, stats: StepStats) -> None:
        return None

    def on_finish(self, req: SimRequest) -> None:
        meta = req.meta
        if (
            isinstance(meta, RequestMeta)
            and meta.output.hit is not None
            and req.finish_reason == "length"
        ):
            req.finish_reason = "stop"


class Replica:
    """One simulated vLLM server with its GPU: engine task, HTTP app, DCGM app, faults."""

    def __init__(
        self,
        settings: SimSettings,
        index: int,
        port: int,
        dcgm_port: int | None,
        host: str = "127.0.0.1",
        clock: Clock | None = None,
        span_exporter: Any = None,
    ):
        self.settings = settings
        self.index = index
        self.name = f"{settings.name_prefix}-{index}"
        self.host = host
        self.port = port
        self.dcgm_port = dcgm_port
        self.clock: Clock = clock or WallClock(settings.speed)
        self.model = settings.model_profile()
        self.gpu_profile = settings.gpu_profile()
        self.roofline = Roofline(self.model, self.gpu_profile)
        self.engine_config = settings.engine_config(index)
        self.faults = Faults()
        self.gpu = GpuModel(
            self.gpu_profile,
            self.model,
            self.engine_config.block_size,
            self.clock.now,
            pod=self.name,
            index=0,
            hostname=f"{settings.hostname_prefix}-{index}",
            namespace=settings.namespace,
        )
        self.emitter: SpanEmitter | None = None
        if span_exporter is not None:
            # deferred: the OpenTelemetry SDK only loads when spans are exported
            from slokit.lab.sim.tracing import SpanEmitter

            self.emitter = SpanEmitter(span_exporter, self.name, settings.service_name)
        self._rng = random.Random(settings.seed * 7919 + index)
        self._frontend_lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None
        self._dcgm_runner: web.AppRunner | None = None
        self.up = False
        self.restarts = 0
        self._crash_task: asyncio.Task[None] | None = None
        self._fresh_engine()
        self.apply_faults(settings.faults)

    # ---- engine state (rebuilt on restart) --------------------------------------------
    def _fresh_engine(self) -> None:
        cfg = self.engine_config
        self.core = EngineCore(cfg, self.roofline)
        kv_bytes = cfg.num_gpu_blocks * cfg.block_size * self.model.kv_bytes_per_token
        self.metrics = VllmMetrics(self.settings.model_name, cfg, kv_bytes)
        self.core.listeners.append(_StopStringListener())
        self.core.listeners.append(self.metrics)
        self.core.listeners.append(self.gpu)
        if self.emitter is not None:
            self.core.listeners.append(_TraceListener(self.emitter))
        lag = self.settings.max_lag_s * self.settings.speed  # in simulated seconds
        self.loop = EngineLoop(self.core, self.clock, lag)

    def apply_faults(self, faults: Faults) -> None:
        self.faults = faults
        core = self.core
        core.clock_ratio = faults.gpu_clock_ratio
        core.step_gap_s = faults.step_gap_s
        core.kv.shrink_to(faults.kv_blocks or core.kv.num_blocks)
        if core.kv.enable_prefix_caching != faults.prefix_caching:
            core.set_prefix_caching(
                faults.prefix_caching and self.engine_config.enable_prefix_caching
            )
        if faults.spec_decode is not None:
            core.set_spec_decode(
                faults.spec_decode.num_speculative_tokens, faults.spec_decode.acceptance_rate
            )
        else:
            core.set_spec_decode(0, 0.0)
        self.gpu.clock_ratio = faults.gpu_clock_ratio
        self.gpu.xid = faults.xid

    def fault_state(self) -> dict[str, Any]:
        """What ``GET /admin/faults`` answers."""
        return {
            "replica": self.name,
            "scenario": self.settings.scenario,
            "restarts": self.restarts,
            "faults": self.faults.to_json(),
        }

    def update_faults(self, body: Any) -> dict[str, Any]:
        """Apply a ``POST /admin/faults`` body (FaultError when invalid); a crash it asks
        for starts on the next loop iteration. Returns the new fault state."""
        update = apply_update(self.faults, body)
        self.apply_faults(update.faults)
        state = self.fault_state()
        if update.crash is not None:
            state["crashing"] = True
            down = update.crash.down_s
            loop = asyncio.get_running_loop()
            loop.call_soon(lambda: setattr(self, "_crash_task", loop.create_task(self.crash(down))))
        return state

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        self.loop.start()
        self._runner, self.port = await serve(vllm_app(self), self.host, self.port)
        if self.dcgm_port is not None and self._dcgm_runner is None:
            self._dcgm_runner, self.dcgm_port = await serve(
                dcgm_app(self), self.host, self.dcgm_port
            )
        self.up = True

    async def stop(self) -> None:
        self.up = False
        if self._crash_task is not None:
            self._crash_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._crash_task
        await self.loop.stop()
        self.core.fail_all(self.clock.now())
        for runner in (self._runner, self._dcgm_runner):
            if runner is not None:
                await runner.cleanup()
        self._runner = self._dcgm_runner = None
        if self.emitter is not None:
            self.emitter.shutdown()

    async def crash(self, down_s: float) -> None:
        """In-flight requests fail, the port stops answering; after ``down_s`` wall
        seconds the replica comes back with a fresh engine (counters reset)."""
        self.up = False
        await self.loop.stop()
        self.core.fail_all(self.clock.now())
        for _ in range(3):  # let handlers write their error responses
            await asyncio.sleep(0)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await asyncio.sleep(down_s)
        self.restarts += 1
        self._fresh_engine()
        self.apply_faults(self.faults)
        await self.start()

    # ---- request path -----------------------------------------------------------------
    async def admit(
        self, body: Any, kind: str, headers: Mapping[str, str], arrival: float
    ) -> tuple[SimRequest, bool, bool]:
        """The front of the request path, shared by the HTTP routes and
        :meth:`generate_in_process`: validation, trace context, injected errors and the
        frontend queue, in that order. Returns (request, stream, include_usage); raises
        :class:`ApiError` where the server answers with an error status."""
        parsed = parse_request(
            body,
            kind,
            self.settings.model_name,
            self.engine_config.max_model_len,
            headers.get("X-Request-Id"),
        )
        meta = parsed.meta
        req = SimRequest(
            request_id=meta.span_id,
            prompt_token_ids=parsed.prompt,
            max_tokens=parsed.max_tokens,
            output_len=parsed.output_len,
            arrival_time=arrival,
            temperature=parsed.temperature,
            top_p=parsed.top_p,
            n=parsed.n,
            seed=parsed.seed,
        )
        req.meta = meta
        if self.emitter is not None:
            meta.parent = self.emitter.parent_context(headers)
        if self.faults.error_rate and self._rng.random() < self.faults.error_rate:
            raise engine_dead()
        delay = self.faults.frontend_delay_s
        if delay > 0:
            async with self._frontend_lock:
                await self.clock.sleep(delay)
        if not self.up:
            raise ApiError(503, "The server is restarting.", "ServiceUnavailableError")
        return req, parsed.stream, parsed.include_usage

    async def generate_in_process(
        self,
        kind: str,
        body: Any,
        headers: Mapping[str, str],
        on_tokens: Callable[[SimRequest], None],
    ) -> SimRequest:
        """The request path of the OpenAI routes without HTTP (virtual-time runs): the same
        validation, faults, frontend queue, engine and spans, in the same order, so the
        physics are the same. ``on_tokens(req)`` is called in the engine step that made
        ``req.new_tokens`` (it resets them), as a streaming client would see them. Returns
        the finished request (``finish_reason`` ``error`` when the engine died);
        :class:`ApiError` where the server answers with an error status."""
        req, _, _ = await self.admit(body, kind, headers, self.clock.now())
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def notify() -> None:
            if req.new_tokens:
                on_tokens(req)
            if req.finished and not done.done():
                done.set_result(None)

        req.notify = notify
        self.loop.submit(req)
        try:
            await done
        except asyncio.CancelledError:
            self.core.abort(req, self.clock.now())
            raise
        return req
