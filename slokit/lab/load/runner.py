"""The runner: sends a run's requests on its clock and turns each answer into a record.

Open loop: a request is sent at its scheduled time whether or not earlier ones have
answered. Closed loop: each user sends its next request as soon as the previous one
finished. Every request carries ``X-Request-Id: <run>-<seq>`` and a W3C ``traceparent`` (a
fresh trace id and span id, or the client span's), so its record joins the server's spans.
Several base URLs get the requests in strict round-robin order, as a cache-unaware gateway
in front of several replicas would route them.

The end of a run: when its duration is reached, sending stops and the requests in flight
get ``drain_s`` (on the run's clock) to finish; those still running then are cut and
recorded with status ``incomplete`` and error type :data:`LOAD_END`, which is no failure of
the server (load tools report it apart). A request that reaches the client's own
``timeout_s`` first is a ``timeout``, a failure the caller felt. A cut request exports no
client span: a span says only ok or error, and would store it as one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from slokit import clientlog as cl
from slokit.lab.load.clock import Clock
from slokit.lab.load.config import LoadConfig
from slokit.lab.load.records import RecordWriter, new_record
from slokit.lab.load.stats import Progress, ProgressCallback, RunStats, percentile
from slokit.lab.load.stream import apply_event, error_type, exception_type
from slokit.lab.load.tracing import ClientTracer, operation_name, request_span_attributes
from slokit.lab.load.urls import request_url
from slokit.lab.workload import RequestSpec

if TYPE_CHECKING:
    from opentelemetry.trace import Span

#: The error type of a request cut at the end of a run, after the drain (status ``incomplete``).
LOAD_END = "load_end"


class Runner:
    """One run's requests, stats and records.

    :meth:`_exchange` is the one step that talks to the server (one HTTP request, its
    stream read into the record); the virtual-time harness overrides it to call a
    simulated replica in-process and drives :meth:`open_loop` itself.
    """

    def __init__(
        self,
        config: LoadConfig,
        session: aiohttp.ClientSession,
        clock: Clock,
        model: str,
        tracer: ClientTracer | None,
        writer: RecordWriter | None,
    ) -> None:
        self.cfg = config
        self.session = session
        self.clock = clock
        self.model = model
        self.tracer = tracer
        self.writer = writer
        self._urls = itertools.cycle(
            [request_url(u, config.endpoint) for u in (config.url, *config.more_urls)]
        )
        self.run_id = config.run_id or f"load-{secrets.token_hex(3)}"
        self.stats = RunStats()
        self.records: list[dict[str, Any]] = []
        self.in_flight = 0
        self._seq = 0
        self._cut: set[asyncio.Task[Any]] = set()  # tasks cut at the run's end, after the drain

    def next_id(self) -> str:
        self._seq += 1
        return f"{self.run_id}-{self._seq}"

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": spec.max_tokens}
        if self.cfg.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            body["prompt"] = spec.prompt
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if spec.ignore_eos:
            body["ignore_eos"] = True
        return body

    async def one(self, spec: RequestSpec, scheduled_ts: float | None) -> None:
        rid = self.next_id()
        url = next(self._urls)
        send_ts = self.clock.now()
        span = self.tracer.start(self._span_name(), send_ts) if self.tracer else None
        if span is not None:
            ctx = span.get_span_context()
            trace_id, span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
        else:
            trace_id, span_id = _random_hex(16), _random_hex(8)
        headers = {
            **self.cfg.headers,
            "X-Request-Id": rid,
            "traceparent": f"00-{trace_id}-{span_id}-01",
        }
        rec = new_record(
            request_id=rid,
            trace_id=trace_id,
            model=self.model,
            slo_class=spec.slo_class,
            task_id=spec.task_id,
            tenant=spec.tenant,
            send_ts=send_ts,
            max_tokens=spec.max_tokens,
            scheduled_ts=scheduled_ts,
        )
        self.stats.sent += 1
        if self.stats.first_send is None:
            self.stats.first_send = send_ts
        self.stats.last_send = send_ts
        self.in_flight += 1
        token_ts: list[float] = []
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                await self._exchange(url, self.body(spec), headers, rec, token_ts)
        except TimeoutError:
            rec[cl.STATUS], rec[cl.ERROR_TYPE] = "timeout", "timeout"
        except asyncio.CancelledError:
            if asyncio.current_task() in self._cut:
                rec[cl.STATUS], rec[cl.ERROR_TYPE] = "incomplete", LOAD_END
            else:  # the run itself was stopped
                rec[cl.STATUS], rec[cl.ERROR_TYPE] = "cancelled", "cancelled"
            raise
        except Exception as exc:  # one failed request must not end the run
            rec[cl.STATUS], rec[cl.ERROR_TYPE] = "error", exception_type(exc)
        finally:
            self.in_flight -= 1
            self._complete(rec, token_ts, span, url)

    async def _exchange(
        self,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
        rec: dict[str, Any],
        token_ts: list[float],
    ) -> None:
        chat = self.cfg.endpoint == "chat"
        now = self.clock.now
        async with self.session.post(url, json=body, headers=headers) as resp:
            rec[cl.HTTP_STATUS] = resp.status
            if resp.status != 200:
                raw = await resp.read()
                rec[cl.STATUS], rec[cl.ERROR_TYPE] = "error", error_type(raw, resp.status)
                return
            done = False
            buf = b""
            async for data in resp.content.iter_any():
                if done:
                    continue  # read to the end so the connection goes back to the pool
                t = now()
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    if not apply_event(payload, t, chat, rec, token_ts):
                        return
            if done:
                rec[cl.STATUS] = "ok"
            else:
                rec[cl.STATUS], rec[cl.ERROR_TYPE] = "error", "stream_truncated"

    def _span_name(self) -> str:
        return f"{operation_name(self.cfg.endpoint == 'chat')} {self.model}"

    def _complete(
        self, rec: dict[str, Any], token_ts: list[float], span: Span | None, url: str
    ) -> None:
        finish = self.clock.now()
        rec[cl.FINISH_TS] = finish
        rec[cl.E2E_S] = finish - rec[cl.SEND_TS]
        if token_ts:
            rec[cl.FIRST_TOKEN_TS] = token_ts[0]
            rec[cl.TTFT_S] = token_ts[0] - rec[cl.SEND_TS]
            rec[cl.ITL_S] = [b - a for a, b in itertools.pairwise(token_ts)]
        if rec[cl.STATUS] is None:
            rec[cl.STATUS], rec[cl.ERROR_TYPE] = "error", "unknown"
        self.stats.add(rec)
        if self.writer is not None:
            self.writer.write(rec)
        if self.cfg.keep_records:
            self.records.append(rec)
        if span is not None and self.tracer is not None:
            self.tracer.finish(
                span,
                request_span_attributes(rec, url, self.model, self.cfg.endpoint == "chat"),
                finish,
                failed=rec[cl.STATUS] != "ok",
            )

    # -- loops --

    async def open_loop(
        self, start: float, schedule: list[float], sampler_next: Callable[[], RequestSpec]
    ) -> None:
        tasks: set[asyncio.Task[None]] = set()
        try:
            for offset in schedule:
                at = start + offset
                # Drawn in schedule order (reproducible), while waiting for the send time;
                # drawing them all up front would hold a long run's prompts in memory.
                spec = sampler_next()
                await self.clock.sleep_until(at)
                task = asyncio.create_task(self.one(spec, at))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(0)  # let it stamp send_ts and issue before moving on
            # The run ends at its duration, or at the last send when sending fell behind.
            await self._drain(tasks, max(start + self.cfg.duration_s, self.clock.now()))
        finally:
            await _cancel_all(tasks)

    async def closed_loop(self, start: float, sampler_next: Callable[[], RequestSpec]) -> None:
        assert self.cfg.users is not None
        end = start + self.cfg.duration_s

        async def user() -> None:
            while self.clock.now() < end:
                await self.one(sampler_next(), None)

        tasks = {asyncio.create_task(user()) for _ in range(self.cfg.users)}
        try:
            await self._drain(tasks, end)
        finally:
            await _cancel_all(tasks)

    async def _drain(self, tasks: set[asyncio.Task[None]], end: float) -> None:
        """Wait for ``tasks`` until ``end + drain_s`` on the run's clock, then cut the ones
        still running (their requests are recorded ``incomplete``). A task that failed
        raises here."""
        drain = self.cfg.drain_s
        bound = (
            asyncio.create_task(self.clock.sleep_until(end + drain))
            if math.isfinite(drain)
            else None
        )
        try:
            while pending := {t for t in tasks if not t.done()}:
                waiting = pending if bound is None else {*pending, bound}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for t in done - {bound}:
                    if not t.cancelled() and (exc := t.exception()) is not None:
                        raise exc
                if bound is not None and bound.done():
                    bound.result()
                    break
        finally:
            if bound is not None and not bound.done():
                bound.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await bound
        cut = {t for t in tasks if not t.done()}
        if cut:
            self._cut |= cut
            await _cancel_all(cut)

    async def report_progress(self, start: float, callback: ProgressCallback) -> None:
        while True:
            await asyncio.sleep(self.cfg.progress_interval_s)
            s = self.stats
            callback(
                Progress(
                    elapsed_s=self.clock.now() - start,
                    duration_s=self.cfg.duration_s,
                    sent=s.sent,
                    ok=s.ok,
                    failed=s.errors + s.timeouts + s.cancelled,
                    in_flight=self.in_flight,
                    ttft_p50_s=percentile(s.ttft[-2000:], 50),
                )
            )


async def _cancel_all(tasks: set[asyncio.Task[None]]) -> None:
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


def _random_hex(nbytes: int) -> str:
    while True:
        h = secrets.token_hex(nbytes)
        if h.strip("0"):  # all-zero ids are invalid in W3C trace context
            return h
