"""The load generator behind ``slokit load``: schedules, the async runner, client records.

Open loop (``rate``): send times are precomputed from the seed (Poisson or constant
spacing) and kept even when the server is slow; a request is sent at its scheduled time
whether or not earlier ones have answered, and how late each send was is recorded
(``send_ts - scheduled_ts``). Closed loop (``users``): N users each send their next
request as soon as the previous one finished.

Every request streams (``stream: true``, ``stream_options: {include_usage: true}``) to an
OpenAI-compatible ``/v1/completions`` or ``/v1/chat/completions`` and carries
``X-Request-Id: <run>-<seq>`` and a W3C ``traceparent`` (a fresh trace id and span id), so
the client record joins the server's spans. Measured on the client: TTFT (first content
chunk), every inter-token gap, E2E, token counts from the final usage chunk, HTTP status,
errors and timeouts. With an OTLP endpoint a CLIENT span per request is exported too; its
ids are the ones sent in ``traceparent``.

One JSON line per request (:data:`RECORD_KEYS`, in that order), written as the run goes
and flushed in small batches; ``slokit ingest requests`` reads these files. Times are Unix
epoch seconds, durations seconds, unknowns ``null``. ``ttft_s`` runs from the send to the
first content chunk, ``itl_s`` lists the gaps between content chunks, ``e2e_s`` runs to the
end of the stream; token counts come from the usage chunk. vLLM may pack several tokens
into one chunk when its API server falls behind, so a record can hold fewer gaps than
``output_tokens - 1`` (TPOT is ``(e2e - ttft) / (output_tokens - 1)``). ``scheduled_ts``
is the planned send time in the open loop and ``null`` in the closed loop. ``status`` is
``ok`` (the stream ended with ``[DONE]``), ``error`` (HTTP error, error event, broken or
truncated stream; ``error_type`` says which), ``timeout`` or ``cancelled`` (the run was
stopped).

Several base URLs (``url`` and ``more_urls``) get the requests in strict round-robin order, as
a cache-unaware gateway in front of several replicas would route them.

The achieved rate is the number of requests sent over the scheduled duration, or over the
time the last send actually took when that is longer: a generator that falls behind its
schedule shows a lower rate, one that keeps it shows the target.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from slokit.errors import BadInput
from slokit.lab.workload import DEFAULT_WORKLOAD, RequestSpec, Workload

Arrival = Literal["poisson", "constant"]
Endpoint = Literal["completions", "chat"]

#: The keys of one client record, in file order (the store's ingest reads them).
RECORD_KEYS: tuple[str, ...] = (
    "request_id",
    "trace_id",
    "model",
    "slo_class",
    "task_id",
    "tenant",
    "send_ts",
    "first_token_ts",
    "finish_ts",
    "ttft_s",
    "e2e_s",
    "itl_s",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "status",
    "http_status",
    "error_type",
    "finish_reason",
    "scheduled_ts",
)


# --- schedules -----------------------------------------------------------------------


def poisson_schedule(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Send offsets (seconds from start) of a Poisson process at ``rate`` over ``duration_s``.

    The process is conditioned on its count: exactly ``round(rate * duration_s)`` arrivals,
    placed uniformly at random (the order statistics of a Poisson process given its count),
    so the offered rate equals the target and the gaps are exponential.
    """
    _check_rate(rate, duration_s)
    n = round(rate * duration_s)
    return sorted(rng.uniform(0.0, duration_s) for _ in range(n))


def constant_schedule(rate: float, duration_s: float) -> list[float]:
    """Send offsets ``0, 1/rate, 2/rate, ...`` below ``duration_s``."""
    _check_rate(rate, duration_s)
    n = round(rate * duration_s)
    return [i / rate for i in range(n)]


def make_schedule(
    arrival: Arrival, rate: float, duration_s: float, rng: random.Random
) -> list[float]:
    if arrival == "poisson":
        return poisson_schedule(rate, duration_s, rng)
    if arrival == "constant":
        return constant_schedule(rate, duration_s)
    raise BadInput(f"unknown arrival process {arrival!r} (poisson or constant)")


def _check_rate(rate: float, duration_s: float) -> None:
    if not rate > 0 or not math.isfinite(rate):
        raise BadInput(f"rate must be a positive number, got {rate!r}")
    if not duration_s > 0:
        raise BadInput(f"duration must be positive, got {duration_s!r}")
    if round(rate * duration_s) < 1:
        raise BadInput(f"rate {rate:g}/s over {duration_s:g}s schedules no request at all")


# --- clock ---------------------------------------------------------------------------


class Clock(Protocol):
    """Wall time in Unix epoch seconds, and a way to wait until a given instant."""

    def now(self) -> float: ...

    async def sleep_until(self, ts: float) -> None: ...


class SystemClock:
    """Epoch time read from the monotonic high-resolution counter, anchored once.

    Steps of the system clock during a run do not distort measured durations.
    """

    def __init__(self) -> None:
        self._epoch0 = time.time()
        self._perf0 = time.perf_counter()

    def now(self) -> float:
        return self._epoch0 + (time.perf_counter() - self._perf0)

    async def sleep_until(self, ts: float) -> None:
        delay = ts - self.now()
        if delay > 0:
            await asyncio.sleep(delay)


# --- configuration and results -------------------------------------------------------


@dataclass(slots=True)
class LoadConfig:
    """One load run. Exactly one of ``rate`` (open loop) and ``users`` (closed loop)."""

    url: str
    duration_s: float
    rate: float | None = None
    #: Further replicas: requests go round-robin over ``(url, *more_urls)``.
    more_urls: tuple[str, ...] = ()
    users: int | None = None
    workload: Workload = field(default_factory=lambda: DEFAULT_WORKLOAD)
    arrival: Arrival = "poisson"
    seed: int = 0
    model: str | None = None
    endpoint: Endpoint = "completions"
    timeout_s: float = 300.0
    headers: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    otlp_endpoint: str | None = None
    out: Path | None = None
    keep_records: bool = True
    progress_interval_s: float = 1.0

    def validate(self) -> None:
        if (self.rate is None) == (self.users is None):
            raise BadInput("give exactly one of --rate (open loop) and --users (closed loop)")
        if self.rate is not None:
            _check_rate(self.rate, self.duration_s)
        if self.users is not None and self.users < 1:
            raise BadInput(f"--users must be at least 1, got {self.users}")
        if not self.duration_s > 0:
            raise BadInput(f"--duration must be positive, got {self.duration_s}")
        if not self.timeout_s > 0:
            raise BadInput(f"--timeout must be positive, got {self.timeout_s}")
        if self.endpoint not in ("completions", "chat"):
            raise BadInput(f"--endpoint must be completions or chat, got {self.endpoint!r}")
        if self.arrival not in ("poisson", "constant"):
            raise BadInput(f"--arrival must be poisson or constant, got {self.arrival!r}")
        for url in (self.url, *self.more_urls):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise BadInput(f"--url must be an http(s) URL, got {url!r}")


@dataclass(slots=True)
class LoadSummary:
    """What a run achieved; the numbers the CLI prints at the end."""

    run_id: str
    mode: str  # "open" | "closed"
    target_rate: float | None
    users: int | None
    duration_s: float
    scheduled: int
    sent: int
    ok: int
    errors: int
    timeouts: int
    cancelled: int
    achieved_rate: float | None
    send_lag_p50_s: float | None
    send_lag_p99_s: float | None
    send_lag_max_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    e2e_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    output_tokens: int
    output_tokens_per_s: float | None
    out: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(slots=True)
class LoadResult:
    summary: LoadSummary
    records: list[dict[str, Any]]


@dataclass(slots=True)
class Progress:
    """A snapshot handed to the progress callback about once per interval."""

    elapsed_s: float
    duration_s: float
    sent: int
    ok: int
    failed: int
    in_flight: int
    ttft_p50_s: float | None


ProgressCallback = Callable[[Progress], None]


# --- record writing ------------------------------------------------------------------


class RecordWriter:
    """Appends client records as JSON lines, flushing every ``batch`` records or
    ``flush_interval_s`` seconds, so a crash loses at most one small batch."""

    def __init__(
        self,
        path: Path,
        *,
        batch: int = 64,
        flush_interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh: IO[str] = path.open("w", encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"cannot write records to {path}: {exc.strerror or exc}") from exc
        self._buf: list[str] = []
        self._batch = batch
        self._interval = flush_interval_s
        self._clock = clock
        self._last_flush = clock()

    def write(self, record: dict[str, Any]) -> None:
        self._buf.append(json.dumps(record, separators=(",", ":")))
        if len(self._buf) >= self._batch or self._clock() - self._last_flush >= self._interval:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            self._fh.write("\n".join(self._buf) + "\n")
            self._buf.clear()
        self._fh.flush()
        self._last_flush = self._clock()

    def close(self) -> None:
        self.flush()
        self._fh.close()


# --- client spans --------------------------------------------------------------------


class _ClientTracer:
    """Exports one CLIENT span per request through the OpenTelemetry SDK."""

    def __init__(self, exporter: Any, *, batch: bool) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        self._provider = TracerProvider(resource=Resource.create({"service.name": "slokit-load"}))
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("slokit.lab.load")

    def start(self, name: str, start_ts: float) -> Any:
        from opentelemetry.trace import SpanKind

        return self._tracer.start_span(name, kind=SpanKind.CLIENT, start_time=int(start_ts * 1e9))

    @staticmethod
    def finish(span: Any, attributes: dict[str, Any], end_ts: float, failed: bool) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if failed:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=int(end_ts * 1e9))

    def shutdown(self) -> None:
        self._provider.shutdown()


def _otlp_http_exporter(endpoint: str) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadInput(f"--otlp-endpoint must be an http(s) URL, got {endpoint!r}")
    if parts.path in ("", "/"):
        endpoint = urlunsplit(parts._replace(path="/v1/traces"))
    return OTLPSpanExporter(endpoint=endpoint)


# --- URLs ----------------------------------------------------------------------------


def request_url(base: str, endpoint: Endpoint) -> str:
    """``http://h:8000`` (or ``.../v1``) -> the completions or chat completions URL; a URL
    that already names a ``.../completions`` path is used as given."""
    u = base.rstrip("/")
    if u.endswith("/completions"):
        return u
    if u.endswith("/v1"):
        u = u[: -len("/v1")]
    return u + ("/v1/completions" if endpoint == "completions" else "/v1/chat/completions")


def models_url(base: str) -> str:
    parts = urlsplit(base)
    path = parts.path.rstrip("/")
    cut = path.find("/v1")
    root = path[:cut] if cut >= 0 else path
    return urlunsplit(parts._replace(path=root + "/v1/models", query="", fragment=""))


async def discover_model(session: aiohttp.ClientSession, base: str) -> str:
    """The first model the server lists at ``/v1/models``."""
    url = models_url(base)
    try:
        async with asyncio.timeout(10.0), session.get(url) as resp:
            resp.raise_for_status()
            doc = await resp.json(content_type=None)
        return str(doc["data"][0]["id"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise BadInput(
            f"could not discover the model from {url} ({type(exc).__name__}); pass --model"
        ) from exc


# --- statistics ----------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100), ``None`` for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(slots=True)
class _Stats:
    sent: int = 0
    ok: int = 0
    errors: int = 0
    timeouts: int = 0
    cancelled: int = 0
    output_tokens: int = 0
    first_send: float | None = None
    last_send: float | None = None
    last_finish: float | None = None
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)

    def add(self, rec: dict[str, Any]) -> None:
        status = rec["status"]
        if status == "ok":
            self.ok += 1
            if rec["ttft_s"] is not None:
                self.ttft.append(rec["ttft_s"])
            if rec["e2e_s"] is not None:
                self.e2e.append(rec["e2e_s"])
            out = rec["output_tokens"]
            if out and out > 1 and rec["ttft_s"] is not None and rec["e2e_s"] is not None:
                self.tpot.append((rec["e2e_s"] - rec["ttft_s"]) / (out - 1))
        elif status == "timeout":
            self.timeouts += 1
        elif status == "cancelled":
            self.cancelled += 1
        else:
            self.errors += 1
        if rec["output_tokens"]:
            self.output_tokens += rec["output_tokens"]
        if rec["finish_ts"] is not None:
            self.last_finish = max(self.last_finish or 0.0, rec["finish_ts"])
        if rec["scheduled_ts"] is not None:
            self.lag.append(rec["send_ts"] - rec["scheduled_ts"])


# --- the runner ----------------------------------------------------------------------


class _Runner:
    def __init__(
        self,
        config: LoadConfig,
        session: aiohttp.ClientSession,
        clock: Clock,
        model: str,
        tracer: _ClientTracer | None,
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
        self.stats = _Stats()
        self.records: list[dict[str, Any]] = []
        self.in_flight = 0
        self._seq = 0

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
        rec: dict[str, Any] = dict.fromkeys(RECORD_KEYS)
        rec.update(
            request_id=rid,
            trace_id=trace_id,
            model=self.model,
            slo_class=spec.slo_class,
            task_id=spec.task_id,
            tenant=spec.tenant,
            send_ts=send_ts,
            max_tokens=spec.max_tokens,
            itl_s=[],
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
            rec["status"], rec["error_type"] = "timeout", "timeout"
        except asyncio.CancelledError:
            rec["status"], rec["error_type"] = "cancelled", "cancelled"
            raise
        except Exception as exc:  # one failed request must not end the run
            rec["status"], rec["error_type"] = "error", _exception_type(exc)
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
            rec["http_status"] = resp.status
            if resp.status != 200:
                raw = await resp.read()
                rec["status"], rec["error_type"] = "error", _error_type(raw, resp.status)
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
                    if not _on_event(payload, t, chat, rec, token_ts):
                        return
            if done:
                rec["status"] = "ok"
            else:
                rec["status"], rec["error_type"] = "error", "stream_truncated"

    def _span_name(self) -> str:
        op = "chat" if self.cfg.endpoint == "chat" else "text_completion"
        return f"{op} {self.model}"

    def _complete(self, rec: dict[str, Any], token_ts: list[float], span: Any, url: str) -> None:
        finish = self.clock.now()
        rec["finish_ts"] = finish
        rec["e2e_s"] = finish - rec["send_ts"]
        if token_ts:
            rec["first_token_ts"] = token_ts[0]
            rec["ttft_s"] = token_ts[0] - rec["send_ts"]
            rec["itl_s"] = [b - a for a, b in itertools.pairwise(token_ts)]
        if rec["status"] is None:
            rec["status"], rec["error_type"] = "error", "unknown"
        self.stats.add(rec)
        if self.writer is not None:
            self.writer.write(rec)
        if self.cfg.keep_records:
            self.records.append(rec)
        if span is not None and self.tracer is not None:
            self.tracer.finish(
                span,
                {
                    "http.request.method": "POST",
                    "http.response.status_code": rec["http_status"],
                    "url.full": url,
                    "gen_ai.operation.name": "chat"
                    if self.cfg.endpoint == "chat"
                    else "text_completion",
                    "gen_ai.request.model": self.model,
                    "gen_ai.request.max_tokens": rec["max_tokens"],
                    "gen_ai.usage.input_tokens": rec["prompt_tokens"],
                    "gen_ai.usage.output_tokens": rec["output_tokens"],
                    "slokit.request_id": rec["request_id"],
                    "slokit.slo_class": rec["slo_class"],
                    "slokit.task_id": rec["task_id"],
                    "slokit.tenant": rec["tenant"],
                    "slokit.client.ttft_s": rec["ttft_s"],
                    "slokit.status": rec["status"],
                    "error.type": rec["error_type"],
                },
                finish,
                failed=rec["status"] != "ok",
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
            while tasks:
                await asyncio.wait(set(tasks))
        finally:
            await _cancel_all(tasks)

    async def closed_loop(self, start: float, sampler_next: Callable[[], RequestSpec]) -> None:
        assert self.cfg.users is not None
        end = start + self.cfg.duration_s

        async def user() -> None:
            while self.clock.now() < end:
                await self.one(sampler_next(), None)

        tasks = [asyncio.create_task(user()) for _ in range(self.cfg.users)]
        try:
            await asyncio.gather(*tasks)
        finally:
            await _cancel_all(set(tasks))

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

    def summary(self, start: float, scheduled: int) -> LoadSummary:
        s = self.stats
        cfg = self.cfg
        achieved = None
        if s.sent and s.last_send is not None:
            achieved = s.sent / max(cfg.duration_s, s.last_send - start)
        out_rate = None
        if s.last_finish is not None and s.last_finish > start:
            out_rate = s.output_tokens / (s.last_finish - start)
        return LoadSummary(
            run_id=self.run_id,
            mode="open" if cfg.rate is not None else "closed",
            target_rate=cfg.rate,
            users=cfg.users,
            duration_s=cfg.duration_s,
            scheduled=scheduled,
            sent=s.sent,
            ok=s.ok,
            errors=s.errors,
            timeouts=s.timeouts,
            cancelled=s.cancelled,
            achieved_rate=achieved,
            send_lag_p50_s=percentile(s.lag, 50),
            send_lag_p99_s=percentile(s.lag, 99),
            send_lag_max_s=max(s.lag) if s.lag else None,
            ttft_p50_s=percentile(s.ttft, 50),
            ttft_p95_s=percentile(s.ttft, 95),
            ttft_p99_s=percentile(s.ttft, 99),
            e2e_p50_s=percentile(s.e2e, 50),
            e2e_p95_s=percentile(s.e2e, 95),
            e2e_p99_s=percentile(s.e2e, 99),
            tpot_p50_s=percentile(s.tpot, 50),
            tpot_p95_s=percentile(s.tpot, 95),
            output_tokens=s.output_tokens,
            output_tokens_per_s=out_rate,
            out=str(cfg.out) if cfg.out is not None else None,
        )


def _on_event(
    payload: bytes, t: float, chat: bool, rec: dict[str, Any], token_ts: list[float]
) -> bool:
    """Apply one SSE ``data:`` event to the record; ``False`` ends the stream as an error.

    A completions chunk with choices is one engine step (its text may be empty while the
    detokenizer holds back a partial character); a chat chunk counts only when it carries
    content, since vLLM sends the assistant role chunk before the first token.
    """
    try:
        obj = json.loads(payload)
    except ValueError:
        rec["status"], rec["error_type"] = "error", "bad_sse_json"
        return False
    if not isinstance(obj, dict):
        rec["status"], rec["error_type"] = "error", "bad_sse_json"
        return False
    if "error" in obj:
        rec["status"], rec["error_type"] = "error", _error_type(payload, None)
        return False
    choices = obj.get("choices")
    if choices:
        c = choices[0]
        if chat:
            delta = c.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                token_ts.append(t)
        else:
            token_ts.append(t)
        if c.get("finish_reason") is not None:
            rec["finish_reason"] = c["finish_reason"]
    usage = obj.get("usage")
    if usage:
        rec["prompt_tokens"] = usage.get("prompt_tokens")
        rec["output_tokens"] = usage.get("completion_tokens")
    return True


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


def _exception_type(exc: BaseException) -> str:
    """A stable name for a client-side failure."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_error"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server_disconnected"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "stream_truncated"
    return type(exc).__name__


def _error_type(raw: bytes, http_status: int | None) -> str:
    """vLLM's ``{"error": {"type": ...}}`` or ``http_<status>`` when the body says nothing."""
    try:
        err = json.loads(raw).get("error")
        if isinstance(err, dict) and err.get("type"):
            return str(err["type"])
        if isinstance(err, str) and err:
            return err
    except (ValueError, AttributeError):
        pass
    return f"http_{http_status}" if http_status is not None else "stream_error"


async def run_load(
    config: LoadConfig,
    *,
    connector: aiohttp.BaseConnector | None = None,
    clock: Clock | None = None,
    span_exporter: Any = None,
    on_progress: ProgressCallback | None = None,
) -> LoadResult:
    """Run one load test and return its summary (and records, when ``keep_records``).

    ``connector`` replaces how connections are made (any aiohttp connector, e.g. a
    ``UnixConnector`` or a ``TCPConnector`` with its own resolver; the caller closes it),
    ``clock`` the time source, ``span_exporter`` the OTLP exporter (any OpenTelemetry ``SpanExporter``; spans
    are then exported synchronously, one per request).
    """
    config.validate()
    clock = clock or SystemClock()
    rng = random.Random(config.seed)
    tracer: _ClientTracer | None = None
    if span_exporter is not None:
        tracer = _ClientTracer(span_exporter, batch=False)
    elif config.otlp_endpoint:
        tracer = _ClientTracer(_otlp_http_exporter(config.otlp_endpoint), batch=True)
    writer = RecordWriter(config.out) if config.out is not None else None
    try:
        if connector is None:
            # aiohttp rather than httpx: streaming 16-token responses at 200 req/s, httpx cost
            # 3-7 ms of CPU per request (httpcore scans its whole pool on every request and
            # retries a failing import of sniffio each time), aiohttp about 0.8 ms.
            # Unbounded in the open loop (a send never queues behind a busy connection); one
            # connection per user in the closed loop.
            connector = aiohttp.TCPConnector(
                limit=config.users or 0, limit_per_host=0, keepalive_timeout=30.0
            )
            owner = True
        else:
            owner = False
        async with aiohttp.ClientSession(
            connector=connector,
            connector_owner=owner,
            timeout=aiohttp.ClientTimeout(total=None),  # the runner times each request
        ) as session:
            model = (
                config.model or config.workload.model or await discover_model(session, config.url)
            )
            runner = _Runner(config, session, clock, model, tracer, writer)
            sampler = config.workload.sampler(rng, runner.run_id)
            schedule: list[float] = []
            if config.rate is not None:
                schedule = make_schedule(config.arrival, config.rate, config.duration_s, rng)
            start = clock.now()
            progress = (
                asyncio.create_task(runner.report_progress(start, on_progress))
                if on_progress is not None
                else None
            )
            try:
                if config.rate is not None:
                    await runner.open_loop(start, schedule, sampler.next)
                else:
                    await runner.closed_loop(start, sampler.next)
            finally:
                if progress is not None:
                    progress.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await progress
            summary = runner.summary(start, len(schedule) if config.rate else runner.stats.sent)
            return LoadResult(summary=summary, records=runner.records)
    finally:
        if writer is not None:
            writer.close()
        if tracer is not None:
            await asyncio.to_thread(tracer.shutdown)


# --- sweeps --------------------------------------------------------------------------


def sweep_out_path(out: Path, rate: float) -> Path:
    """``load.jsonl`` at rate 5 -> ``load.rate5.jsonl`` (one file per rate)."""
    label = f"{rate:g}"
    suffix = out.suffix or ".jsonl"
    return out.with_name(f"{out.stem}.rate{label}{suffix}")


async def run_sweep(
    config: LoadConfig,
    rates: Sequence[float],
    *,
    connector: aiohttp.BaseConnector | None = None,
    clock: Clock | None = None,
    span_exporter: Any = None,
    on_progress: ProgressCallback | None = None,
    on_step: Callable[[LoadSummary], Awaitable[None] | None] | None = None,
) -> list[LoadResult]:
    """Run the open-loop schedule at each rate in turn, one records file per rate.

    Step ``i`` (from 1) uses run id ``<run>-s<i>`` (request ids stay unique across files)
    and seed ``seed + i - 1``; each step waits for its last answers before the next starts.
    """
    if config.users is not None:
        raise BadInput("--sweep runs the open loop; use it with rates, not --users")
    if not rates:
        raise BadInput("--sweep needs at least one rate")
    base_id = config.run_id or f"load-{secrets.token_hex(3)}"
    results: list[LoadResult] = []
    for i, rate in enumerate(rates):
        step = replace(
            config,
            rate=rate,
            run_id=f"{base_id}-s{i + 1}",
            out=sweep_out_path(config.out, rate) if config.out is not None else None,
            seed=config.seed + i,
        )
        res = await run_load(
            step,
            connector=connector,
            clock=clock,
            span_exporter=span_exporter,
            on_progress=on_progress,
        )
        results.append(res)
        if on_step is not None:
            maybe = on_step(res.summary)
            if maybe is not None:
                await maybe
    return results


# --- text output ---------------------------------------------------------------------


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}ms"


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def format_summary(s: LoadSummary) -> str:
    """The end-of-run summary, a few aligned lines."""
    if s.mode == "open":
        load = f"open loop, target {_num(s.target_rate, 'g')} req/s over {s.duration_s:g}s"
    else:
        load = f"closed loop, {s.users} users over {s.duration_s:g}s"
    lines = [
        f"run {s.run_id}: {load}",
        f"  requests  sent {s.sent}  ok {s.ok}  errors {s.errors}  timeouts {s.timeouts}"
        f"  cancelled {s.cancelled}",
        f"  rate      achieved {_num(s.achieved_rate, '.2f')} req/s",
    ]
    if s.mode == "open":
        lines[-1] += (
            f"  (send lag p50 {_ms(s.send_lag_p50_s)}  p99 {_ms(s.send_lag_p99_s)}"
            f"  max {_ms(s.send_lag_max_s)})"
        )
    lines += [
        f"  TTFT      p50 {_ms(s.ttft_p50_s)}  p95 {_ms(s.ttft_p95_s)}  p99 {_ms(s.ttft_p99_s)}",
        f"  E2E       p50 {_ms(s.e2e_p50_s)}  p95 {_ms(s.e2e_p95_s)}  p99 {_ms(s.e2e_p99_s)}",
        f"  TPOT      p50 {_ms(s.tpot_p50_s)}  p95 {_ms(s.tpot_p95_s)}",
        f"  output    {s.output_tokens} tokens, {_num(s.output_tokens_per_s)} tokens/s",
    ]
    if s.out:
        lines.append(f"  records   {s.out}")
    return "\n".join(lines)


def format_sweep_table(summaries: Sequence[LoadSummary]) -> str:
    """One row per rate: what was offered, what came back."""
    header = (
        f"{'rate':>8} {'achieved':>9} {'ok':>6} {'failed':>6} {'ttft_p50':>10} "
        f"{'ttft_p95':>10} {'tpot_p50':>10} {'out_tok/s':>10}"
    )
    rows = [header]
    for s in summaries:
        rows.append(
            f"{_num(s.target_rate, 'g'):>8} {_num(s.achieved_rate, '.2f'):>9} {s.ok:>6} "
            f"{s.errors + s.timeouts + s.cancelled:>6} {_ms(s.ttft_p50_s):>10} "
            f"{_ms(s.ttft_p95_s):>10} {_ms(s.tpot_p50_s):>10} "
            f"{_num(s.output_tokens_per_s):>10}"
        )
    return "\n".join(rows)


def format_progress(p: Progress) -> str:
    return (
        f"[{p.elapsed_s:6.1f}s/{p.duration_s:g}s] sent {p.sent} ok {p.ok} failed {p.failed} "
        f"in flight {p.in_flight} ttft p50 {_ms(p.ttft_p50_s)}"
    )
