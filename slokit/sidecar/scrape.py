"""Scrape loops: vLLM, dcgm-exporter and gateway router ``/metrics`` on an interval, and the
NVML poller. A router target (the llm-d router / Inference Extension EPP) is parsed by
:mod:`slokit.sources.router_metrics` into ``router_samples``.

A scrape is all or nothing: a target that is down, slow (past the timeout, which is below
the interval), answers non-200, or garbage is dropped whole, counted in
``slokit_scrape_failures_total{reason}``, ``slokit_scrape_up`` goes 0, and a ``scrapes``
row with ``up=false`` records the gap so analysis knows it was blind. A counter that goes
down (the target restarted) is counted in ``slokit_counter_resets_total`` and recorded on the
scrape row (``error='counter reset'``); the sample itself is valid and kept.

What a target sends is bounded, as Prometheus bounds it: a body past ``body_limit_bytes``
(after Content-Encoding is undone, chunk by chunk: a gzip bomb stops at the limit) fails
with reason ``body_size_limit``, and an exposition with more than ``sample_limit`` samples
(lines that are neither blank nor comments) fails whole with reason ``sample_limit``. Both
are checked while the body streams in, so reading stops at the limit and nothing larger is
ever held. Parsing runs in a worker thread, off the event loop that serves ``/healthz`` and
the OTLP receivers. Per target, only the last scrape's counters are kept (restart detection).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from slokit.errors import BadInput
from slokit.records import EngineSample, GpuSample, RouterSample, ScrapeResult
from slokit.sidecar.config import Target
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.write_errors import QueueFull, WriterStopped
from slokit.sidecar.writer import Writer

log = logging.getLogger("slokit.sidecar.scrape")

#: Counter fields of EngineSample compared between scrapes to detect a restart.
_COUNTERS = (
    "preemptions_total", "prompt_tokens_total", "generation_tokens_total",
    "prefix_cache_queries_total", "prefix_cache_hits_total", "request_success_total",
)  # fmt: skip

#: Defaults of the limits (``scrape_body_limit_bytes``, ``scrape_sample_limit``).
MAX_SCRAPE_BYTES = 16 * 1024 * 1024
MAX_SCRAPE_SAMPLES = 10_000
#: A line that starts with neither a newline (blank) nor ``#`` (comment): a sample.
_SAMPLE_LINE = re.compile(rb"\n[^\n#]")


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
    router: list[RouterSample] = field(default_factory=list)


@dataclass
class _Parsed:
    """One scrape's records, by the kind of target."""

    engine: list[EngineSample] = field(default_factory=list)
    gpu: list[GpuSample] = field(default_factory=list)
    router: list[RouterSample] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.engine) + len(self.gpu) + len(self.router)


class _Body:
    """The body of one scrape as it streams in: decoded, measured and counted per chunk."""

    def __init__(self, encoding: str | None, body_limit: int, sample_limit: int) -> None:
        enc = (encoding or "identity").strip().lower()
        self._gzip = enc in ("gzip", "x-gzip")
        self._after = b""  # the bytes after a finished gzip member, until they say what follows
        if enc in ("gzip", "x-gzip", "deflate"):
            wbits = 16 + zlib.MAX_WBITS if self._gzip else zlib.MAX_WBITS
            self._zlib: Any = zlib.decompressobj(wbits)
        elif enc in ("", "identity"):
            self._zlib = None
        else:
            raise ScrapeFailed("garbage", f"unsupported Content-Encoding {encoding!r}")
        self.body_limit = body_limit
        self.sample_limit = sample_limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.samples = 0
        self._last = b"\n"  # the byte before the next chunk: a line starts at the body's start

    def feed(self, raw: bytes) -> None:
        if self._zlib is None:
            self._add(raw)
            return
        data = raw
        while data:
            if self._zlib.eof:
                data = self._next_member(data)
                if not data:
                    return
            try:  # never inflate more than the limit allows, whatever the ratio
                out = self._zlib.decompress(data, self.body_limit - self.size + 1)
            except zlib.error as exc:
                raise ScrapeFailed("garbage", f"corrupt compressed body: {exc}") from None
            self._add(out)
            data = self._zlib.unconsumed_tail or (self._zlib.unused_data if self._zlib.eof else b"")

    def _next_member(self, data: bytes) -> bytes:
        """What follows a finished member: the next one, as gzip allows several (RFC 1952;
        returned, a new inflater ready), or anything else: ``garbage``. Less than the two
        bytes that tell is kept for the next chunk (b"" returned)."""
        data, self._after = self._after + data, b""
        if len(data) < 2:
            self._after = data
            return b""
        if not (self._gzip and data.startswith(b"\x1f\x8b")):
            raise ScrapeFailed("garbage", "data after the end of the compressed body")
        self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        return data

    def _add(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.size += len(chunk)
        if self.size > self.body_limit:
            raise ScrapeFailed("body_size_limit", f"body over {self.body_limit} bytes")
        self.samples += len(_SAMPLE_LINE.findall(self._last + chunk))
        if self.sample_limit and self.samples > self.sample_limit:
            raise ScrapeFailed("sample_limit", f"more than {self.sample_limit} samples")
        self._last = chunk[-1:]
        self.chunks.append(chunk)

    def bytes(self) -> bytes:
        if self._zlib is not None and (not self._zlib.eof or self._after):
            raise ScrapeFailed("garbage", "truncated compressed body")
        body = b"".join(self.chunks)
        self.chunks.clear()
        return body


def _drop_frames(exc: BaseException) -> None:
    """Let go of the frames a failed scrape's exceptions (and their causes) hold.

    asyncio's futures keep an exception whose traceback keeps the frames that hold the
    futures: a cycle only the cyclic collector frees, which the sidecar runs seldom
    (:mod:`slokit._gc`). Those frames hold what the scrape had read and inflated so far, up
    to ``scrape_body_limit_bytes``: a target refused at the limit every second would pile up
    16 MiB a scrape. Without tracebacks the frames go at once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]


def collect_young() -> None:
    """Free the reference cycles a failed scrape left (called as each one returns).

    A scrape stopped partway (a body or sample limit, a timeout, a broken connection) leaves
    cycles inside httpx, httpcore and asyncio (their frames, tracebacks, the stream and its
    socket transport) that hold what was read: about 200 KB each. Only the cyclic collector
    frees them, and the sidecar's schedule (:mod:`slokit._gc`) runs a young collection every
    50,000 net allocations: a target refused at its limit every second piled them up for
    about 400 scrapes, RssAnon 51 -> 127 MB, before one ran (600 scrapes in one process,
    side by side: with this, 51 -> 57 MB). Once the scrape has returned they are unreachable
    and young (made since the last collection), so a young collection frees them; it walks
    only what was allocated since the last one: 0.1 ms median, 1.4 ms at most."""
    gc.collect(0)


#: After a flush this big, hand the freed memory back to the OS (see :func:`release_memory`).
BIG_FLUSH_RECORDS = 20_000


def release_memory() -> None:
    """Return free heap pages to the OS (glibc's ``malloc_trim``; a no-op elsewhere). A huge
    scrape's records are made in a parse thread and freed after the writer's commit, and glibc
    keeps that memory in those threads' arenas: measured after a 200k-series target (no sample
    limit) recovered, RSS stayed at 490-620 MB without this, 320-330 MB with it. (No
    ``gc.collect()``: the records make no cycles, and a full collection holds the GIL long.)"""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


#: The text format 0.0.4 asked for: a server that negotiates (prometheus_client's
#: ``choose_encoder``, as vLLM's Python server) answers OpenMetrics whenever
#: ``application/openmetrics-text`` is listed at all, whatever its q, and the text format is
#: what :mod:`slokit.sources.fastparse` reads fastest. A server that only speaks OpenMetrics 1.0
#: answers it anyway: :func:`~slokit.sources.exposition.parse_exposition` knows it by ``# EOF``.
_SCRAPE_HEADERS = {"Accept-Encoding": "identity", "Accept": "text/plain;version=0.0.4,*/*;q=0.1"}


def _parse(target: Target, body: bytes, ts: float, invalid: Counter[str] | None = None) -> _Parsed:
    """Values out of their field's range become None, counted by field in ``invalid``."""
    if target.kind == "vllm":
        from slokit.sources.vllm_metrics import parse_vllm_metrics

        return _Parsed(
            engine=parse_vllm_metrics(body, ts=ts, replica=target.replica, invalid=invalid)
        )
    if target.kind == "router":
        from slokit.sources.router_metrics import parse_router_metrics

        return _Parsed(
            router=parse_router_metrics(body, ts=ts, router=target.replica, invalid=invalid)
        )
    from slokit.sources.dcgm import parse_dcgm_metrics

    gpus = parse_dcgm_metrics(body, ts=ts, invalid=invalid)
    for g in gpus:
        if g.replica is None:
            g.replica = target.replica
    return _Parsed(gpu=gpus)


def _empty_pending() -> dict[str, list[Any]]:
    """Records buffered between flushes, by writer kind (samples before their scrape rows)."""
    return {"engine": [], "gpu": [], "router_samples": [], "scrapes": []}


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
        sample_limit: int = MAX_SCRAPE_SAMPLES,
        body_limit_bytes: int = MAX_SCRAPE_BYTES,
    ) -> None:
        """``sample_limit``: more samples than this fail the scrape whole (0: no limit);
        ``body_limit_bytes``: reading stops past this many (decoded) bytes, the scrape fails."""
        self.targets = targets
        self.writer = writer
        self.metrics = metrics
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.on_up = on_up
        self.sample_limit = sample_limit
        self.body_limit_bytes = body_limit_bytes
        self._client = httpx.AsyncClient(
            transport=transport, timeout=httpx.Timeout(timeout_s), follow_redirects=False
        )
        # target url -> (model, engine) -> counters of its last scrape (only the last: a
        # target that once served many engines does not keep them in memory)
        self._last: dict[str, dict[tuple[str, str | None], dict[str, float]]] = {}
        self._pending: dict[str, list[Any]] = _empty_pending()
        self._big_flush = False
        self._tasks: list[asyncio.Task[None]] = []

    async def scrape_once(self, target: Target) -> ScrapeOutcome:
        ts = self.clock()
        t0 = time.perf_counter()
        m = self.metrics
        try:
            body = await asyncio.wait_for(self._fetch(target), self.timeout_s)
            # parsing and the reset check are pure Python, proportional to the samples
            # (seconds for a huge body): never on the event loop. One scrape of a target
            # runs at a time (its loop awaits each), so the check has ``_last`` to itself.
            invalid: Counter[str] = Counter()
            parsed, reset = await asyncio.to_thread(self._parse_checked, target, body, ts,
                                                    invalid)  # fmt: skip
            del body
        except (ScrapeFailed, TimeoutError, BadInput) as exc:
            _drop_frames(exc)
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
        for name, n in invalid.items():
            m.sample_values_invalid.labels(kind=target.kind, field=name).inc(n)
        if reset:
            m.counter_resets.labels(target=target.url).inc()
        m.scrape_up.labels(target=target.url, kind=target.kind, replica=target.replica).set(1)
        m.scrape_duration.labels(target=target.url, kind=target.kind).set(dur)
        health = ScrapeResult(ts, target.url, target.kind, target.replica, True, dur,
                              "counter reset" if reset else None, len(parsed))  # fmt: skip
        return ScrapeOutcome(health, parsed.engine, parsed.gpu, reset, parsed.router)

    async def _fetch(self, target: Target) -> bytes:
        limit = self.body_limit_bytes
        try:
            async with self._client.stream("GET", target.url, headers=_SCRAPE_HEADERS) as resp:
                if resp.status_code != 200:
                    raise ScrapeFailed("http_status", f"HTTP {resp.status_code}")
                length = resp.headers.get("Content-Length", "")
                encoding = resp.headers.get("Content-Encoding")
                if length.isdigit() and int(length) > limit and not encoding:
                    raise ScrapeFailed("body_size_limit", f"Content-Length {length} over {limit}")
                body = _Body(encoding, limit, self.sample_limit)
                try:
                    async for raw in resp.aiter_raw():
                        body.feed(raw)
                    return body.bytes()
                finally:
                    body.chunks.clear()  # a failed scrape's traceback keeps this frame
        except httpx.TimeoutException as exc:
            raise ScrapeFailed("timeout", f"timed out: {exc}") from None
        except httpx.HTTPError as exc:
            raise ScrapeFailed("down", f"{type(exc).__name__}: {exc}") from None

    def _parse_checked(
        self, target: Target, body: bytes, ts: float, invalid: Counter[str]
    ) -> tuple[_Parsed, bool]:
        parsed = _parse(target, body, ts, invalid)
        return parsed, self._check_reset(target, parsed.engine)

    def _check_reset(self, target: Target, engine: list[EngineSample]) -> bool:
        reset = False
        prev_all = self._last.get(target.url, {})
        last: dict[tuple[str, str | None], dict[str, float]] = {}
        for s in engine:
            key = (s.model, s.engine)
            now = {c: v for c in _COUNTERS if (v := getattr(s, c)) is not None}
            prev = prev_all.get(key)
            if prev and any(now.get(c, prev[c]) < prev[c] for c in prev):
                reset = True
            last[key] = now
        self._last[target.url] = last
        return reset

    def _store(self, outcome: ScrapeOutcome) -> None:
        """Buffer one scrape's records; :meth:`flush` hands a whole tick to the writer."""
        self._pending["engine"].extend(outcome.engine)
        self._pending["gpu"].extend(outcome.gpu)
        self._pending["router_samples"].extend(outcome.router)
        self._pending["scrapes"].append(outcome.health)

    def flush(self) -> None:
        """Submit what the loops scraped since the last flush: one write per kind, not one per
        target (each write is a transaction; per-target writes cost more than parsing)."""
        pending, self._pending = self._pending, _empty_pending()
        self._big_flush = sum(len(v) for v in pending.values()) > BIG_FLUSH_RECORDS
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
            if self._big_flush:  # the last one's records are committed and freed by now
                await asyncio.to_thread(release_memory)
            self.flush()

    async def _loop(self, target: Target) -> None:
        next_at = time.monotonic()
        task = asyncio.current_task()
        while True:
            outcome = await self.scrape_once(target)
            if task is not None and task.cancelling():
                # a stop that arrived as the fetch ended: on 3.11 asyncio.wait_for swallows
                # it (returning the fetch's outcome), and the loop would scrape on while
                # stop() waits for it (seen under load: stop() never returned)
                raise asyncio.CancelledError
            if not outcome.health.up:  # what it left is garbage now, all of it young
                collect_young()
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
