"""Scrape loops: vLLM and dcgm-exporter ``/metrics`` on an interval, and the NVML poller.

A scrape is all or nothing: a target that is down, slow (past the timeout, which is below
the interval), answers non-200, too big, or garbage is dropped whole, counted in
``slokit_scrape_failures_total{reason}``, ``slokit_scrape_up`` goes 0, and a ``scrapes``
row with ``up=false`` records the gap so analysis knows it was blind. A counter that goes
down (the target restarted) is counted in ``slokit_counter_resets_total`` and recorded on the
scrape row (``error='counter reset'``); the sample itself is valid and kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from slokit.errors import BadInput
from slokit.records import EngineSample, GpuSample, ScrapeResult
from slokit.sidecar.config import Target
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.writer import QueueFull, Writer, WriterStopped

log = logging.getLogger("slokit.sidecar.scrape")

#: Counter fields of EngineSample compared between scrapes to detect a restart.
_COUNTERS = (
    "preemptions_total", "prompt_tokens_total", "generation_tokens_total",
    "prefix_cache_queries_total", "prefix_cache_hits_total", "request_success_total",
)  # fmt: skip

MAX_SCRAPE_BYTES = 16 * 1024 * 1024


class ScrapeFailed(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class ScrapeOutcome:
    """What one scrape yielded (for tests and the loop)."""

    health: ScrapeResult
    engine: list[EngineSample] = field(default_factory=list)
    gpu: list[GpuSample] = field(default_factory=list)
    reset: bool = False


def _parse(target: Target, body: bytes, ts: float) -> tuple[list[EngineSample], list[GpuSample]]:
    if target.kind == "vllm":
        from slokit.sources.vllm_metrics import parse_vllm_metrics

        return parse_vllm_metrics(body, ts=ts, replica=target.replica), []
    from slokit.sources.dcgm import parse_dcgm_metrics

    gpus = parse_dcgm_metrics(body, ts=ts)
    for g in gpus:
        if g.replica is None:
            g.replica = target.replica
    return [], gpus


class Scraper:
    """Scrapes one target per loop; ``transport`` and ``clock`` are injectable."""

    def __init__(
        self,
        targets: list[Target],
        writer: Writer,
        metrics: SidecarMetrics,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 0.8,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
        on_up: Callable[[Target, bool, float], None] | None = None,
    ) -> None:
        self.targets = targets
        self.writer = writer
        self.metrics = metrics
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.on_up = on_up
        self._client = httpx.AsyncClient(
            transport=transport, timeout=httpx.Timeout(timeout_s), follow_redirects=False
        )
        self._last: dict[tuple[str, str, str | None], dict[str, float]] = {}
        self._pending: dict[str, list[Any]] = {"engine": [], "gpu": [], "scrapes": []}
        self._tasks: list[asyncio.Task[None]] = []

    async def scrape_once(self, target: Target) -> ScrapeOutcome:
        ts = self.clock()
        t0 = time.perf_counter()
        m = self.metrics
        try:
            body = await asyncio.wait_for(self._fetch(target), self.timeout_s)
            engine, gpu = _parse(target, body, ts)
        except (ScrapeFailed, TimeoutError, BadInput) as exc:
            reason = (
                exc.reason if isinstance(exc, ScrapeFailed)
                else "timeout" if isinstance(exc, TimeoutError) else "garbage"
            )  # fmt: skip
            detail = str(exc) or reason
            dur = time.perf_counter() - t0
            m.scrape_failures.labels(target=target.url, kind=target.kind, reason=reason).inc()
            m.scrape_up.labels(target=target.url, kind=target.kind, replica=target.replica).set(0)
            m.scrape_duration.labels(target=target.url, kind=target.kind).set(dur)
            health = ScrapeResult(ts, target.url, target.kind, target.replica, False, dur,
                                  f"{reason}: {detail}"[:500])  # fmt: skip
            return ScrapeOutcome(health)
        dur = time.perf_counter() - t0
        reset = self._check_reset(target, engine)
        if reset:
            m.counter_resets.labels(target=target.url).inc()
        m.scrape_up.labels(target=target.url, kind=target.kind, replica=target.replica).set(1)
        m.scrape_duration.labels(target=target.url, kind=target.kind).set(dur)
        health = ScrapeResult(ts, target.url, target.kind, target.replica, True, dur,
                              "counter reset" if reset else None, len(engine) + len(gpu))  # fmt: skip
        return ScrapeOutcome(health, engine, gpu, reset)

    async def _fetch(self, target: Target) -> bytes:
        try:
            async with self._client.stream("GET", target.url) as resp:
                if resp.status_code != 200:
                    raise ScrapeFailed("http_status", f"HTTP {resp.status_code}")
                chunks = []
                size = 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_SCRAPE_BYTES:
                        raise ScrapeFailed("too_large", f"body over {MAX_SCRAPE_BYTES} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
        except httpx.TimeoutException as exc:
            raise ScrapeFailed("timeout", f"timed out: {exc}") from None
        except httpx.HTTPError as exc:
            raise ScrapeFailed("down", f"{type(exc).__name__}: {exc}") from None

    def _check_reset(self, target: Target, engine: list[EngineSample]) -> bool:
        reset = False
        for s in engine:
            key = (target.url, s.model, s.engine)
            now = {c: v for c in _COUNTERS if (v := getattr(s, c)) is not None}
            prev = self._last.get(key)
            if prev and any(now.get(c, prev[c]) < prev[c] for c in prev):
                reset = True
            self._last[key] = now
        return reset

    def _store(self, outcome: ScrapeOutcome) -> None:
        """Buffer one scrape's records; :meth:`flush` hands a whole tick to the writer."""
        self._pending["engine"].extend(outcome.engine)
        self._pending["gpu"].extend(outcome.gpu)
        self._pending["scrapes"].append(outcome.health)

    def flush(self) -> None:
        """Submit what the loops scraped since the last flush: one write per kind, not one per
        target (each write is a transaction; per-target writes cost more than parsing)."""
        pending, self._pending = self._pending, {"engine": [], "gpu": [], "scrapes": []}
        for kind, recs in pending.items():
            if not recs:
                continue
            try:
                self.writer.submit(kind, recs)  # type: ignore[arg-type]
            except (QueueFull, WriterStopped):
                self.metrics.dropped.labels(reason=f"scrape_{kind}").inc(len(recs))

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.flush()

    async def _loop(self, target: Target) -> None:
        next_at = time.monotonic()
        while True:
            outcome = await self.scrape_once(target)
            self._store(outcome)
            if self.on_up is not None:
                self.on_up(target, outcome.health.up, self.interval_s)
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind: skip the missed ticks rather than burst
                next_at = time.monotonic()
                delay = 0
            await asyncio.sleep(delay)

    def start(self) -> None:
        for t in self.targets:
            self._tasks.append(asyncio.create_task(self._loop(t), name=f"scrape {t.url}"))
        self._tasks.append(asyncio.create_task(self._flush_loop(), name="scrape flush"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.flush()
        await self._client.aclose()


class NvmlLoop:
    """Polls NVML on the interval in a worker thread (NVML calls block)."""

    def __init__(
        self,
        poller: Any,
        writer: Writer,
        metrics: SidecarMetrics,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.poller = poller
        self.writer = writer
        self.metrics = metrics
        self.interval_s = interval_s
        self.clock = clock
        self._task: asyncio.Task[None] | None = None

    async def poll_once(self) -> None:
        t0 = time.perf_counter()
        poll = await asyncio.to_thread(self.poller.poll, self.clock())
        dur = time.perf_counter() - t0
        for h in poll.health:
            h.duration_s = dur
            self.metrics.scrape_up.labels(
                target=h.target, kind="nvml", replica=h.replica or ""
            ).set(1 if h.up else 0)
            self.metrics.scrape_duration.labels(target=h.target, kind="nvml").set(dur)
            if not h.up:
                self.metrics.scrape_failures.labels(
                    target=h.target, kind="nvml", reason="nvml"
                ).inc()
        for kind, recs in (("gpu", poll.samples), ("scrapes", poll.health)):
            if recs:
                try:
                    self.writer.submit(kind, recs)  # type: ignore[arg-type]
                except (QueueFull, WriterStopped):
                    self.metrics.dropped.labels(reason=f"scrape_{kind}").inc(len(recs))

    async def _loop(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="nvml")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.poller.close()
