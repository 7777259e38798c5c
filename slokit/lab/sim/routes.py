"""The aiohttp servers of a replica: vLLM's OpenAI API and the GPU's dcgm-exporter.

:func:`vllm_app` serves ``/health``, ``/ping``, ``/version``, ``/metrics``, ``/v1/models``,
``/v1/completions``, ``/v1/chat/completions`` and ``GET/POST /admin/faults``; any other path
answers FastAPI's JSON 404 ``{"detail":"Not Found"}`` as vLLM does. :func:`dcgm_app` serves
the GPU's ``/metrics``. Request handlers only wait for the engine to signal new tokens and
write what :mod:`slokit.lab.sim.openai_responses` builds.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler

from slokit.lab.sim.engine import SimRequest
from slokit.lab.sim.faults import FaultError
from slokit.lab.sim.openai_responses import DONE_EVENT, SseChunks, full_response, models_body
from slokit.lab.sim.openai_wire import (
    VLLM_VERSION,
    ApiError,
    RequestMeta,
    created_now,
    dumps,
    engine_dead,
    error_body,
)
from slokit.lab.sim.output_text import TextStream

if TYPE_CHECKING:
    from slokit.lab.sim.replica import Replica

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NOT_FOUND_BODY = b'{"detail":"Not Found"}'  # FastAPI's answer to an unknown path


def _error(exc: ApiError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status, dumps=dumps)


def _bad_request(message: str) -> web.Response:
    return web.json_response(error_body(400, message, "BadRequestError"), status=400, dumps=dumps)


@web.middleware
async def _json_not_found(request: web.Request, handler: Handler) -> web.StreamResponse:
    if isinstance(request.match_info.http_exception, web.HTTPNotFound):
        return web.Response(status=404, body=NOT_FOUND_BODY, content_type="application/json")
    return await handler(request)


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


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


class _VllmRoutes:
    """The handlers of one replica's OpenAI server."""

    def __init__(self, replica: Replica):
        self.replica = replica

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def metrics(self, request: web.Request) -> web.Response:
        r = self.replica
        if r.faults.metrics_blackout:
            return web.Response(status=503, text="metrics unavailable\n")
        body, content_type = r.metrics.render_for(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def models(self, request: web.Request) -> web.Response:
        r = self.replica
        body = models_body(r.settings.model_name, r.engine_config.max_model_len)
        return web.json_response(body, dumps=dumps)

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.replica.fault_state())

    async def post_faults(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _bad_request("body must be JSON")
        try:
            state = self.replica.update_faults(body)
        except FaultError as exc:
            return _bad_request(str(exc))
        return web.json_response(state)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        replica = self.replica
        arrival = replica.clock.now()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _bad_request(f"JSON decode error: {exc}")
        try:
            req, stream, include_usage = await replica.admit(body, kind, request.headers, arrival)
        except ApiError as exc:
            return _error(exc)
        meta: RequestMeta = req.meta
        signal = _Signal()
        req.notify = signal
        core = replica.core
        replica.loop.submit(req)
        try:
            if stream:
                return await self._stream(request, req, meta, signal, include_usage)
            while not req.finished:
                await signal.wait()
        except asyncio.CancelledError:
            core.abort(req, replica.clock.now())
            raise
        if req.finish_reason == "error":
            return _error(engine_dead())
        text = full_response(req, meta, replica.settings.model_name, created_now())
        return web.Response(body=text.encode(), content_type="application/json")

    async def _stream(
        self,
        request: web.Request,
        req: SimRequest,
        meta: RequestMeta,
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
            self.replica.core.abort(req, self.replica.clock.now())
        return resp

    async def _stream_events(
        self,
        resp: web.StreamResponse,
        req: SimRequest,
        meta: RequestMeta,
        signal: _Signal,
        include_usage: bool,
    ) -> None:
        chunks = SseChunks(meta, self.replica.settings.model_name, created_now())
        if meta.kind == "chat":
            await resp.write(chunks.role().encode())
        texts = TextStream(meta.output)
        while True:
            if req.new_tokens == 0 and not req.finished:
                await signal.wait()
            n_new = req.new_tokens
            req.new_tokens = 0
            if req.finish_reason == "error":
                await resp.write(chunks.engine_dead().encode())
                break
            parts: list[str] = []
            deltas = texts.deltas(n_new, req.finished)
            for i, text in enumerate(deltas):
                if req.finished and i == len(deltas) - 1:
                    parts.append(chunks.token(text, req.finish_reason, meta.output.stop_reason))
                else:
                    parts.append(chunks.token(text, None))
            if req.finished:
                if include_usage:
                    parts.append(chunks.usage(req))
                parts.append(DONE_EVENT)
            if parts:
                await resp.write("".join(parts).encode())
            if req.finished:
                break
        await resp.write_eof()


def vllm_app(replica: Replica) -> web.Application:
    """vLLM's OpenAI server for ``replica``, with the fault admin routes."""
    routes = _VllmRoutes(replica)
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_json_not_found])
    app.router.add_get("/health", _health)
    app.router.add_get("/ping", _health)
    app.router.add_get("/version", routes.version)
    app.router.add_get("/metrics", routes.metrics)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_post("/v1/completions", routes.completions)
    app.router.add_post("/v1/chat/completions", routes.chat)
    app.router.add_get("/admin/faults", routes.get_faults)
    app.router.add_post("/admin/faults", routes.post_faults)
    return app


def dcgm_app(replica: Replica) -> web.Application:
    """The dcgm-exporter of ``replica``'s GPU."""

    async def metrics(request: web.Request) -> web.Response:
        if replica.faults.metrics_blackout:
            return web.Response(status=503, text="metrics unavailable\n")
        return web.Response(
            body=replica.gpu.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", _health)
    return app


async def serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` (0: an ephemeral port); returns the runner and the port."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    server = getattr(site, "_server", None)
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)
