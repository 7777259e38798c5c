"""The sidecar's API on 9464: metrics, probes, explain, diagnose, quality feedback.

Reads run in worker threads on their own DuckDB cursor (the writer keeps the connection), so
a slow query never stalls ingest. ``/healthz`` and ``/readyz`` are open; everything else
needs the bearer token when one is configured.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from slokit.analysis.slo_spec import SloSpec
from slokit.errors import BadInput, NotFound
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.otlp_http import bearer_auth
from slokit.sidecar.writer import QueueFull, Writer, WriterStopped
from slokit.store.db import Store
from slokit.timeutil import parse_time

log = logging.getLogger("slokit.sidecar.api")

MAX_FEEDBACK_BYTES = 4 * 1024 * 1024


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


class Api:
    def __init__(
        self,
        store: Store,
        writer: Writer,
        metrics: SidecarMetrics,
        *,
        spec: SloSpec | None = None,
        ready: Callable[[], bool] | None = None,
        ack_timeout_s: float = 30.0,
    ) -> None:
        self.store = store
        self.writer = writer
        self.metrics = metrics
        self.spec = spec
        self.ready = ready or (lambda: True)
        self.ack_timeout_s = ack_timeout_s

    def app(self, token: str | None = None) -> web.Application:
        app = web.Application(client_max_size=MAX_FEEDBACK_BYTES, middlewares=[bearer_auth(token)])
        r = app.router
        r.add_get("/metrics", self.metrics_handler)
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/api/explain/{request_id}", self.explain)
        r.add_get("/api/diagnose", self.diagnose)
        r.add_post("/v1/feedback", self.feedback)
        return app

    async def _read(self, fn: Callable[[Any], Any]) -> Any:
        def run() -> Any:
            cur = self.store.cursor()
            try:
                return fn(cur)
            finally:
                cur.close()

        return await asyncio.to_thread(run)

    # -- handlers ------------------------------------------------------------------------
    async def metrics_handler(self, request: web.Request) -> web.Response:
        self.metrics.ingest_lag.set(self.writer.lag_s())
        self.metrics.queue_depth.set(self.writer.depth)
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        checks = {"writer": self.writer.alive, "store": self._store_open()}
        checks["started"] = self.ready()
        ok = all(checks.values())
        return web.json_response({"ready": ok, **checks}, status=200 if ok else 503)

    def _store_open(self) -> bool:
        try:
            cur = self.store.cursor()
            cur.execute("SELECT 1").fetchone()
            cur.close()
        except Exception:
            return False
        return True

    async def explain(self, request: web.Request) -> web.Response:
        from slokit.analysis.explain import explain_request

        rid = request.match_info["request_id"]
        try:
            doc = await self._read(lambda con: explain_request(con, rid, spec=self.spec))
        except NotFound as exc:
            return _error(404, str(exc))
        except BadInput as exc:
            return _error(400, str(exc))
        return web.json_response(doc, dumps=lambda o: json.dumps(o, default=str))

    async def diagnose(self, request: web.Request) -> web.Response:
        from slokit.analysis.diagnose import diagnose

        since_raw, until_raw = request.query.get("since"), request.query.get("until")

        def run(con: Any) -> Any:
            since = until = None
            if since_raw or until_raw:
                from slokit.store.queries import data_span

                newest = data_span(con)[1]
                since = parse_time(since_raw, newest) if since_raw else None
                until = parse_time(until_raw, newest) if until_raw else None
            return diagnose(con, since=since, until=until)

        try:
            doc = await self._read(run)
        except NotFound as exc:
            return _error(404, str(exc))
        except BadInput as exc:
            return _error(400, str(exc))
        return web.json_response(doc, dumps=lambda o: json.dumps(o, default=str))

    async def feedback(self, request: web.Request) -> web.Response:
        """``[{"request_id", "quality_pass"}]`` or one such object -> quality fragments."""
        from slokit.sources.files import parse_quality

        try:
            doc = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body must be JSON: [{request_id, quality_pass}] or one object")
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body over {MAX_FEEDBACK_BYTES} bytes")
        rows = doc if isinstance(doc, list) else [doc]
        if not rows or not all(isinstance(r, dict) for r in rows):
            return _error(400, "expected objects with request_id and quality_pass")
        lines = "\n".join(json.dumps(r) for r in rows)
        try:
            frags = parse_quality(lines, name="feedback")
        except BadInput as exc:
            return _error(400, str(exc))
        try:
            fut = self.writer.submit("fragments", frags)
            await asyncio.wait_for(asyncio.wrap_future(fut), self.ack_timeout_s)
        except (QueueFull, WriterStopped, TimeoutError):
            return _error(503, "sidecar overloaded; retry", {"Retry-After": "1"})
        return web.json_response({"accepted": len(frags)})
