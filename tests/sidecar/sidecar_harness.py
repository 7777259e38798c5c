"""Test harness: a real sidecar on free 127.0.0.1 ports, in a background event loop thread.

Tests talk to it over real HTTP/gRPC with synchronous clients, exactly as vLLM or Prometheus
would. Ports are picked by the OS (port 0); the registry and the DuckDB file are per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from slokit.sidecar.config import SidecarConfig
from slokit.sidecar.runner import Sidecar
from slokit.sidecar.writer import Writer
from slokit.store.db import Store

BASE = SidecarConfig(
    otlp_http="127.0.0.1:0",
    otlp_grpc="127.0.0.1:0",
    listen="127.0.0.1:0",
    replica="test-pod",
    # the periodic steps on short intervals, so that a test does not wait for them
    sli_interval_s=0.2,
    sli_grace_s=0.5,
    commit_interval_s=0.5,
)


class LoopThread:
    """An asyncio loop in a daemon thread; :meth:`call` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@dataclass
class Running:
    sidecar: Sidecar
    registry: CollectorRegistry
    db: Path

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.sidecar.ports['api']}"

    @property
    def otlp(self) -> str:
        return f"http://127.0.0.1:{self.sidecar.ports['otlp_http']}/v1/traces"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.sidecar.ports['otlp_grpc']}"

    def committed(self) -> Store:
        """The sidecar's store once every acknowledged fragment is in DuckDB: with the
        journal (the default) the writer commits what it holds first, as the API's reads do."""
        sc = self.sidecar
        assert sc.store is not None and sc.writer is not None
        assert sc.writer.flush(timeout_s=120), f"the writer did not commit: {sc.writer.last_error}"
        return sc.store

    def value(self, name: str, **labels: str) -> float:
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else v


StartSidecar = Callable[..., Running]


def relabel(body: bytes, prefix: str, *, seed: int = 0) -> tuple[bytes, list[str]]:
    """The real export with fresh span ids and request ids ``<prefix>-<i>``: new requests."""
    rng = random.Random(f"{prefix}/{seed}")
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    ids: list[str] = []
    for rs in msg.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.span_id = rng.randbytes(8)
                for kv in span.attributes:
                    if kv.key == "gen_ai.request.id":
                        rid = f"{prefix}-{len(ids)}"
                        kv.value.string_value = f"cmpl-{rid}-0"
                        ids.append(rid)
    return msg.SerializeToString(), ids


def post(url: str, body: bytes, content_type: str = "application/x-protobuf",
         **headers: str) -> httpx.Response:  # fmt: skip
    return httpx.post(url, content=body, headers={"Content-Type": content_type, **headers},
                      timeout=30)  # fmt: skip


def request_ids(running: Running) -> set[str]:
    return stored_request_ids(running.committed())


def stored_request_ids(store: Store) -> set[str]:
    """The request ids in ``store``'s ``requests``, read on a cursor of their own."""
    cur = store.cursor()
    try:
        return {r[0] for r in cur.execute("SELECT request_id FROM requests").fetchall()}
    finally:
        cur.close()


def wait_for(cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_for_progress(
    value: Callable[[], float], target: float, stall_s: float = 120.0, what: str = "progress"
) -> None:
    """Wait until ``value()`` reaches ``target``; give up only once it has not moved for
    ``stall_s`` (a busy machine slows the sidecar, it does not stop it)."""
    last, moved = value(), time.monotonic()
    while (now := value()) < target:
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall_s:
            raise AssertionError(f"{what}: stuck at {now} of {target} for {stall_s:g} s")
        time.sleep(0.05)


class TargetServer:
    """A small aiohttp /metrics target whose behaviour a test switches between scrapes."""

    def __init__(self, lt: LoopThread, fixtures: Path) -> None:
        from aiohttp import web

        self.lt = lt
        self.body = (fixtures / "metrics_after_load.prom").read_bytes()
        self.idle = (fixtures / "metrics_idle.prom").read_bytes()
        self.mode = "ok"
        self.hits = 0

        async def metrics(request: web.Request) -> web.Response:
            self.hits += 1
            if self.mode == "slow":
                await asyncio.sleep(1)
            if self.mode == "garbage":
                return web.Response(body=b"vllm:num_requests_running{ 1 2 3 garbage\n{{{")
            if self.mode == "error":
                return web.Response(status=500, text="boom")
            body = self.idle if self.mode == "restarted" else self.body
            return web.Response(body=body, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        self.port = lt.call(serve_on_free_port(self.runner))
        self.url = f"http://127.0.0.1:{self.port}/metrics"

    def close(self) -> None:
        self.lt.call(self.runner.cleanup())


def closed_port_url() -> str:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/metrics"


async def serve_on_free_port(runner: web.AppRunner) -> int:
    """Start ``runner`` on 127.0.0.1 with a port the OS picks; returns the port."""
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


def store_rows(sc: Running, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` read from the running sidecar's store (its own cursor)."""
    cur = sc.committed().cursor()
    try:
        return cur.execute(sql).fetchall()
    finally:
        cur.close()


def scrape_failures(sc: Running, url: str, reason: str) -> float:
    return sc.value("slokit_scrape_failures_total", target=url, kind="vllm", reason=reason)


@contextlib.contextmanager
def sidecar_process(
    args: list[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    start_timeout_s: float = 90.0,
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, int]]]:
    """A real ``slokit sidecar ARGS`` process, ready (its log says so); yields it and the
    ports it reports (``api``, ``otlp_http``...). Terminated (then killed) on exit."""
    cmd = [sys.executable, "-m", "slokit.cli", "sidecar", *args]
    with log.open("wb") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                 env=None if env is None else dict(env),
                                 preexec_fn=preexec_fn)  # fmt: skip
    try:
        deadline = time.monotonic() + start_timeout_s
        ports: dict[str, int] = {}
        while not ports:
            if popen.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"sidecar did not start:\n{log.read_text()[-3000:]}")
            m = re.search(r"sidecar ready: (.*?);", log.read_text())
            if m:
                ports = {k: int(v) for k, v in re.findall(r"(\w+) port (\d+)", m.group(1))}
            time.sleep(0.1)
        yield popen, ports
    finally:
        popen.terminate()
        try:
            popen.wait(20)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(10)


class FakeClock:
    """A writer's clock (monotonic seconds) that moves only when a test says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def tick(writer: Writer, clock: FakeClock, seconds: float) -> None:
    """Advance ``writer``'s clock by ``seconds`` and wake it."""
    clock.t += seconds
    with writer._cond:
        writer._cond.notify_all()
