"""A small vLLM-like SSE server for the load generator's tests (fixture: ``fake_vllm``).

Its chunks are built from the real vLLM 0.32 capture (``completion_stream.http`` and
``chat_stream.http``): the first content chunk, the final usage chunk and ``[DONE]`` are
the captured JSON with only the text and counts replaced. It runs on 127.0.0.1 (port 0) in
its own thread and event loop so that the client under test measures it from outside.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web


def _sse_chunks(fixtures: Path, name: str) -> list[dict[str, Any]]:
    path = fixtures / "http" / name
    body = path.read_text(encoding="utf-8").split("\n\n", 1)[1]
    return [
        json.loads(line[len("data: ") :])
        for line in body.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def _error_body(fixtures: Path, name: str) -> bytes:
    return (fixtures / "http" / name).read_bytes().split(b"\r\n\r\n", 1)[1]


@dataclass
class Behaviour:
    """What the server does; tests change it before sending load."""

    ttft_s: float = 0.0  # delay before the first token
    itl_s: float = 0.0  # delay between tokens
    status: int = 200  # anything else: an error response instead of a stream
    truncate_after: int | None = None  # close the stream after this many tokens, no [DONE]
    replay: str | None = None  # answer with this captured .http file's SSE body, verbatim


@dataclass
class FakeVllm:
    fixtures: Path
    url: str = ""
    behaviour: Behaviour = field(default_factory=Behaviour)
    received: list[dict[str, Any]] = field(default_factory=list)  # headers + body per request


def _server_app(state: FakeVllm) -> web.Application:
    fixtures = state.fixtures
    comp = _sse_chunks(fixtures, "completion_stream.http")
    chat = _sse_chunks(fixtures, "chat_stream.http")
    too_long = _error_body(fixtures, "error_too_long.http")

    async def models(_: web.Request) -> web.Response:
        return web.Response(
            body=(fixtures / "http" / "models.json").read_bytes(),
            content_type="application/json",
        )

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        # token_ts: the wall-clock time just before each token's chunk was written (what the
        # server did; on a busy machine its sleeps run long)
        token_ts: list[float] = []
        peer = request.transport.get_extra_info("peername") if request.transport else None
        state.received.append(
            {"headers": {k.lower(): v for k, v in request.headers.items()}, "body": body,
             "token_ts": token_ts, "peer": peer}
        )  # fmt: skip
        b = state.behaviour
        if b.status == 400:
            return web.Response(status=400, body=too_long, content_type="application/json")
        if b.status != 200:
            return web.Response(status=b.status, text="Internal Server Error")
        if b.replay is not None:
            raw = (fixtures / "http" / b.replay).read_bytes().split(b"\r\n\r\n", 1)[1]
            replay = web.StreamResponse(
                headers={"content-type": "text/event-stream; charset=utf-8"}
            )
            await replay.prepare(request)
            for event in raw.split(b"\n\n"):
                if event.strip():
                    await replay.write(event + b"\n\n")
                    await asyncio.sleep(b.itl_s)
            await replay.write_eof()
            return replay
        is_chat = request.path.endswith("/chat/completions")
        templates = chat if is_chat else comp
        rid = ("chatcmpl-" if is_chat else "cmpl-") + request.headers.get("X-Request-Id", "x")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)

        async def send(obj: dict[str, Any]) -> None:
            obj["id"] = rid
            await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

        n = int(body["max_tokens"])
        if is_chat:
            await send(copy.deepcopy(templates[0]))  # role chunk, sent before any token
        await asyncio.sleep(b.ttft_s)
        for i in range(n):
            if i:
                await asyncio.sleep(b.itl_s)
            if b.truncate_after is not None and i >= b.truncate_after:
                return resp
            chunk = copy.deepcopy(templates[1] if is_chat else templates[0])
            choice = chunk["choices"][0]
            if is_chat:
                choice["delta"]["content"] = f" {i}"
            else:
                choice["text"] = f" {i}"
            choice["finish_reason"] = "length" if i == n - 1 else None
            token_ts.append(time.time())
            await send(chunk)
        usage = copy.deepcopy(templates[-1])
        prompt_tokens = len(str(body.get("prompt") or body.get("messages")).split())
        usage["usage"] = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + n,
            "completion_tokens": n,
        }
        await send(usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    return app


@contextmanager
def serve_fake_vllm(fixtures: Path) -> Iterator[FakeVllm]:
    """Start the server on 127.0.0.1 (free port) in its own thread; stop it on exit."""
    state = FakeVllm(fixtures)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner = web.AppRunner(_server_app(state))

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state.url = f"http://127.0.0.1:{port}"
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    ready.wait(10)
    try:
        yield state
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
