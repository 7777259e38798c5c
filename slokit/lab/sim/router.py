"""A gateway router in front of a :class:`~slokit.lab.sim.server.SimCluster`'s replicas.

A small model of the llm-d router / Gateway API Inference Extension endpoint picker (EPP):
every request is admitted by its flow control before it reaches a replica. Flow control
dispatches while fewer than ``router_max_inflight`` requests (a fault knob,
:mod:`slokit.lab.sim.faults`; 0: no limit) are in flight through it; the others wait in its
FIFO queue. Nothing is rejected or evicted.

It serves ``GET /metrics`` on its own port with the documented ``llm_d_epp_*`` names and
label sets (those of ``tests/fixtures/router/llm_d_epp.prom``, read by
:mod:`slokit.sources.router_metrics`): request counters and histograms per model
(``fairness_id="default"``, ``priority="0"``), the flow-control queue and its queue time, the
pool's saturation (stage ``effective``) and the pool averages over the replicas' engines. And
``GET/POST /admin/faults`` as a replica does (only ``router_max_inflight`` matters here).

Saturation: with a limit, the share of it in use (1.0: flow control holds new requests);
without one, what the EPP's utilization detector reports from the engines (its default
thresholds: 5 waiting requests, 80% KV usage per endpoint), averaged over the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from slokit.lab.sim.clock import Clock
from slokit.lab.sim.faults import FaultError, Faults, apply_update
from slokit.lab.sim.routes import serve

if TYPE_CHECKING:
    from slokit.lab.sim.replica import Replica

#: The EPP's utilization detector thresholds (llm-d router saturation detector defaults).
QUEUE_DEPTH_THRESHOLD = 5.0
KV_UTIL_THRESHOLD = 0.8
#: Bucket bounds (s) of the router's latency histograms.
QUEUE_BUCKETS: tuple[float, ...] = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS: tuple[float, ...] = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.bounds):
            if v <= b:
                self.counts[i] += 1
        self.sum += v
        self.count += 1

    def lines(self, name: str, labels: dict[str, str]) -> list[str]:
        out = []
        for b, c in zip(self.bounds, self.counts, strict=True):
            out.append(f"{name}_bucket{_labels({**labels, 'le': _num(b)})} {c}")
        out.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {self.count}")
        out.append(f"{name}_sum{_labels(labels)} {_num(self.sum)}")
        out.append(f"{name}_count{_labels(labels)} {self.count}")
        return out


def _num(v: float) -> str:
    return repr(float(v)) if v != int(v) else f"{int(v)}"


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


class SimRouter:
    """The router: flow control in front of ``replicas``, ``/metrics`` on ``port``."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        clock: Clock,
        *,
        model: str,
        pool: str,
        faults: Faults,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.replicas = replicas
        self.clock = clock
        self.model = model
        self.pool = pool
        self.faults = dataclasses.replace(faults)
        self.host = host
        self.port = port
        self.running = 0
        self.requests_total = 0
        self.dispatched = 0
        self._queue: deque[asyncio.Future[None]] = deque()
        self._queue_s = _Histogram(QUEUE_BUCKETS)
        self._duration_s = _Histogram(DURATION_BUCKETS)
        self._runner: web.AppRunner | None = None

    # -- flow control -------------------------------------------------------------------
    @property
    def limit(self) -> int:
        return self.faults.router_max_inflight

    def _has_room(self) -> bool:
        return not self.limit or self.running < self.limit

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Hold a request in flow control until it may be dispatched, then count it in
        flight until the block ends (the replica answered)."""
        t0 = self.clock.now()
        self.requests_total += 1
        if self._queue or not self._has_room():
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queue.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():  # dispatched as it was cancelled
                    self.running -= 1
                    self._dispatch()
                elif fut in self._queue:  # else: skipped by _dispatch as cancelled
                    self._queue.remove(fut)
                raise
        else:
            self.running += 1
        self.dispatched += 1
        self._queue_s.observe(self.clock.now() - t0)
        try:
            yield
        finally:
            self.running -= 1
            self._duration_s.observe(self.clock.now() - t0)
            self._dispatch()

    def _dispatch(self) -> None:
        """Dispatch waiting requests, oldest first, while there is room."""
        while self._queue and self._has_room():
            fut = self._queue.popleft()
            if not fut.done():
                self.running += 1
                fut.set_result(None)

    def update_faults(self, body: Any) -> dict[str, Any]:
        """Apply a ``POST /admin/faults`` body (FaultError when invalid)."""
        self.faults = apply_update(self.faults, body).faults
        self._dispatch()  # a raised limit lets the queue go at once
        return self.fault_state()

    def fault_state(self) -> dict[str, Any]:
        return {"router": self.pool, "faults": self.faults.to_json()}

    # -- the pool as the router sees it ---------------------------------------------------
    def _pool_averages(self) -> tuple[float, float, float, int]:
        """Mean KV usage, waiting and running over the ready replicas, and their count."""
        ready = [r for r in self.replicas if r.up]
        if not ready:
            return 0.0, 0.0, 0.0, 0
        n = len(ready)
        kv = sum(r.core.kv.usage for r in ready) / n
        waiting = sum(len(r.core.waiting) for r in ready) / n
        running = sum(len(r.core.running) for r in ready) / n
        return kv, waiting, running, n

    def saturation(self) -> float:
        if self.limit:
            return self.running / self.limit
        kv, waiting, _, n = self._pool_averages()
        if not n:
            return 1.0
        return max(waiting / QUEUE_DEPTH_THRESHOLD, kv / KV_UTIL_THRESHOLD)

    def render(self) -> bytes:
        """The exposition (text format 0.0.4), names and label sets of the llm-d router."""
        m = self.model
        req = {"fairness_id": "default", "model_name": m, "priority": "0", "target_model_name": m}
        flow = {**req, "inference_pool": self.pool}
        pool = {"name": self.pool}
        kv, waiting, running, ready = self._pool_averages()
        lines: list[str] = []

        def family(name: str, kind: str, doc: str, samples: list[str]) -> None:
            lines.append(f"# HELP {name} [ALPHA] {doc}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples)

        def one(name: str, labels: dict[str, str], v: float) -> list[str]:
            return [f"{name}{_labels(labels)} {_num(v)}"]

        family("llm_d_epp_request_total", "counter", "Total requests.",
               one("llm_d_epp_request_total", req, self.requests_total))  # fmt: skip
        family("llm_d_epp_request_running", "gauge", "Requests currently in flight.",
               one("llm_d_epp_request_running", req, self.running + len(self._queue)))  # fmt: skip
        family("llm_d_epp_request_duration_seconds", "histogram", "End-to-end request latency.",
               self._duration_s.lines("llm_d_epp_request_duration_seconds", req))  # fmt: skip
        for name, doc, v in (
            ("average_kv_cache_utilization", "Mean KV-cache utilization across the pool.", kv),
            ("average_queue_size", "Mean queue depth.", waiting),
            ("average_running_requests", "Mean in-flight requests.", running),
            ("ready_endpoints", "Ready endpoints in the pool.", ready),
        ):
            family(f"llm_d_epp_{name}", "gauge", doc, one(f"llm_d_epp_{name}", pool, v))
        family("llm_d_epp_flow_control_queue_size", "gauge",
               "Requests currently held in the queue.",
               one("llm_d_epp_flow_control_queue_size", flow, len(self._queue)))  # fmt: skip
        family("llm_d_epp_flow_control_pool_saturation", "gauge",
               "Saturation signal used to gate dispatch.",
               one("llm_d_epp_flow_control_pool_saturation",
                   {"inference_pool": self.pool, "stage": "effective"}, self.saturation()))  # fmt: skip
        family("llm_d_epp_flow_control_requests_total", "counter",
               "Requests by terminal outcome.",
               one("llm_d_epp_flow_control_requests_total",
                   {"inference_pool": self.pool, "outcome": "Dispatched", "priority": "0"},
                   self.dispatched))  # fmt: skip
        family("llm_d_epp_flow_control_request_queue_duration_seconds", "histogram",
               "Time from queue entry to terminal outcome.",
               self._queue_s.lines("llm_d_epp_flow_control_request_queue_duration_seconds",
                                   {**flow, "outcome": "Dispatched"}))  # fmt: skip
        return ("\n".join(lines) + "\n").encode()

    # -- server -------------------------------------------------------------------------
    async def start(self) -> None:
        self._runner, self.port = await serve(self._app(), self.host, self.port)

    async def stop(self) -> None:
        for fut in self._queue:
            fut.cancel()
        self._queue.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def _app(self) -> web.Application:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE})

        async def get_faults(_: web.Request) -> web.Response:
            return web.json_response(self.fault_state())

        async def post_faults(request: web.Request) -> web.Response:
            try:
                body = json.loads(await request.read() or b"null")
                return web.json_response(self.update_faults(body))
            except (ValueError, FaultError) as exc:
                return web.json_response({"error": str(exc)}, status=400)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/admin/faults", get_faults)
        app.router.add_post("/admin/faults", post_faults)
        return app
