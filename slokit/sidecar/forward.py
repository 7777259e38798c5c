"""Forward received OTLP bodies, unchanged, to an upstream OTLP/HTTP endpoint.

Ingest never waits for the upstream: bodies go into a bounded queue (by count and bytes) and
one task posts them; when the queue is full or the upstream fails, the body is dropped and
counted in ``slokit_dropped_total{reason="forward_queue_full"|"forward_failed"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

import httpx

from slokit.sidecar.metrics import SidecarMetrics

log = logging.getLogger("slokit.sidecar.forward")


def traces_url(url: str) -> str:
    """``http://collector:4318`` -> ``http://collector:4318/v1/traces``; a path is kept."""
    rest = url.split("://", 1)[-1]
    return url if "/" in rest.rstrip("/") else url.rstrip("/") + "/v1/traces"


class Forwarder:
    def __init__(
        self,
        url: str,
        metrics: SidecarMetrics,
        *,
        max_items: int = 1000,
        max_bytes: int = 64 * 1024 * 1024,
        timeout_s: float = 10.0,
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = traces_url(url)
        self.metrics = metrics
        self.max_items = max_items
        self.max_bytes = max_bytes
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(transport=transport, timeout=timeout_s, headers=headers)
        self._queue: deque[tuple[bytes, str, str | None]] = deque()
        self._bytes = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def submit(self, body: bytes, content_type: str, encoding: str | None) -> None:
        """Queue one body; never blocks."""
        if len(self._queue) >= self.max_items or self._bytes + len(body) > self.max_bytes:
            self.metrics.dropped.labels(reason="forward_queue_full").inc()
            return
        self._queue.append((body, content_type, encoding))
        self._bytes += len(body)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                body, ct, enc = self._queue.popleft()
                self._bytes -= len(body)
                headers = {"Content-Type": ct}
                if enc:
                    headers["Content-Encoding"] = enc
                try:
                    resp = await self._client.post(self.url, content=body, headers=headers)
                    ok = resp.status_code < 300
                except httpx.HTTPError as exc:
                    log.warning("forwarding to %s failed: %s", self.url, exc)
                    ok = False
                if ok:
                    self.sent += 1
                else:
                    self.metrics.dropped.labels(reason="forward_failed").inc()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="otlp forwarder")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.aclose()
