"""Scrape limits: what a target sends is bounded, and a huge target stalls nothing else.

The targets are real aiohttp servers on 127.0.0.1 (port 0) serving generated expositions;
the sidecar is real. Prometheus' semantics: a scrape over ``sample_limit`` fails whole, a
body past ``body_size_limit`` is cut there; both are gaps (``up=false`` with the reason).
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from sidecar_harness import (
    LoopThread,
    Running,
    StartSidecar,
    post,
    relabel,
    scrape_failures,
    serve_on_free_port,
    store_rows,
    wait_for,
)

from slokit.records import ScrapeResult
from slokit.sidecar.config import Target
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.scrape import MAX_SCRAPE_BYTES, MAX_SCRAPE_SAMPLES, ScrapeFailed, Scraper
from slokit.sidecar.writer import Writer
from slokit.store.db import open_store

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def exposition(series: int) -> bytes:
    """A vLLM-looking exposition with ``series`` samples (one engine per model name)."""
    head = "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
    lines = (f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} {i % 7}.0\n'
             for i in range(series))  # fmt: skip
    return (head + "".join(lines)).encode()


def sample_lines(body: bytes) -> int:
    """Samples of an exposition, counted the plain way (the oracle for the streaming count)."""
    return sum(1 for line in body.decode().split("\n") if line and not line.startswith("#"))


class Target_:
    """A /metrics target whose handler a test switches; counts requests and bytes sent."""

    def __init__(self, lt: LoopThread) -> None:
        self.lt = lt
        self.hits = 0
        self.sent = 0
        self.handler: Handler = self.serve(b"")

        async def metrics(request: web.Request) -> web.StreamResponse:
            self.hits += 1
            return await self.handler(request)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        self.url = f"http://127.0.0.1:{lt.call(serve_on_free_port(self.runner))}/metrics"

    def serve(self, body: bytes, **headers: str) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.Response(body=body, content_type="text/plain", headers=headers)

        return handler

    def endless(self, **headers: str) -> Handler:
        """A body that never ends (chunked), sent as fast as the client reads."""
        chunk = exposition(1000)[-60_000:].split(b"\n", 1)[1]

        async def handler(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers=headers)
            resp.content_type = "text/plain"
            await resp.prepare(request)
            try:
                while True:
                    await resp.write(chunk)
                    self.sent += len(chunk)
            except (ConnectionError, RuntimeError):
                pass  # the scraper hung up
            return resp

        return handler

    def close(self) -> None:
        self.lt.call(self.runner.cleanup())


@pytest.fixture
def metrics_target() -> Iterator[Target_]:
    lt = LoopThread()
    t = Target_(lt)
    yield t
    t.close()
    lt.close()


@pytest.fixture(scope="module")
def huge() -> bytes:
    """200k series: 12 MB, under the default body limit, 16 s for the old on-loop parse."""
    return exposition(200_000)


# -- one scrape, against each kind of hostile body ---------------------------------------------
#: The one scrape's timeout: a hang guard, not a bound. A limit cuts the body long before on a
#: quiet machine, but reading 16 MiB under tracemalloc beside two busy processes took over
#: 5 s (the timeout here before), and the scrape failed as a timeout instead of at its limit.
SCRAPE_GUARD_S = 120.0


def _scrape(
    tmp_path: Path,
    t: Target_,
    *,
    sample_limit: int = MAX_SCRAPE_SAMPLES,
    body_limit_bytes: int = MAX_SCRAPE_BYTES,
) -> ScrapeResult:
    store = open_store(tmp_path / "scrape.duckdb")
    metrics = SidecarMetrics(CollectorRegistry())
    scraper = Scraper([], Writer(store, metrics=metrics), metrics, timeout_s=SCRAPE_GUARD_S,
                      sample_limit=sample_limit, body_limit_bytes=body_limit_bytes)  # fmt: skip
    target = Target(t.url, "vllm", "pod-a")

    async def once() -> ScrapeResult:
        try:
            return (await scraper.scrape_once(target)).health
        finally:
            await scraper.stop()

    try:
        health: ScrapeResult = t.lt.call(once(), timeout=SCRAPE_GUARD_S + 30)
        return health
    finally:
        store.close()


BOMB = gzip.compress(b"#" * (64 * 1024 * 1024))  # one 64 MiB comment line in 64 KiB
BYTES_ONLY = {"body_limit_bytes": 1 << 20, "sample_limit": 0}  # 1 MiB, no sample limit


@pytest.mark.parametrize(
    ("make", "limits", "reason"),
    [
        (lambda t: t.endless(), BYTES_ONLY, "body_size_limit"),
        (lambda t: t.serve(exposition(20_000)), BYTES_ONLY, "body_size_limit"),
        (lambda t: t.serve(BOMB, **{"Content-Encoding": "gzip"}), BYTES_ONLY, "body_size_limit"),
        (lambda t: t.serve(b"\x1f\x8b garbage", **{"Content-Encoding": "gzip"}), {}, "garbage"),
        (
            lambda t: t.serve(gzip.compress(exposition(3))[:-12], **{"Content-Encoding": "gzip"}),
            {},
            "garbage",
        ),
        (lambda t: t.serve(exposition(3), **{"Content-Encoding": "br"}), {}, "garbage"),
        (lambda t: t.serve(exposition(101)), {"sample_limit": 100}, "sample_limit"),
        (lambda t: t.endless(), {"sample_limit": 100}, "sample_limit"),
    ],
    ids=[
        "endless",
        "content-length-over",
        "gzip-bomb",
        "corrupt-gzip",
        "truncated-gzip",
        "unknown-encoding",
        "one-sample-over",
        "endless-samples",
    ],
)
def test_a_hostile_body_fails_the_scrape_whole_with_its_reason(
    tmp_path: Path, metrics_target: Target_, make: Callable[[Target_], Handler],
    limits: dict[str, int], reason: str,
) -> None:  # fmt: skip
    metrics_target.handler = make(metrics_target)
    health = _scrape(tmp_path, metrics_target, **limits)
    assert not health.up
    # cut at the limit: a body read on to the guard would fail as a timeout
    assert health.error is not None and health.error.startswith(f"{reason}:"), health.error


@pytest.mark.parametrize(
    "make",
    [lambda t: t.endless(), lambda t: t.serve(BOMB, **{"Content-Encoding": "gzip"})],
    ids=["endless", "gzip-bomb"],
)
def test_a_scrape_refused_at_the_limit_keeps_none_of_its_body(
    tmp_path: Path, metrics_target: Target_, make: Callable[[Target_], Handler]
) -> None:
    """The refusal's exception, kept by asyncio's futures in a cycle only the cyclic
    collector frees, once kept what had been read: 16 MiB a scrape, every second."""
    limit = MAX_SCRAPE_BYTES  # 16 MiB, the default
    metrics_target.handler = make(metrics_target)
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        health = _scrape(tmp_path, metrics_target, body_limit_bytes=limit, sample_limit=0)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    assert health.error is not None and health.error.startswith("body_size_limit"), health.error
    assert held < limit // 4, f"{held / 2**20:.1f} MiB still held after the scrape"


def _responses_alive() -> int:
    """httpx responses the process still has, reachable or only in uncollected cycles."""
    return sum(1 for o in gc.get_objects() if isinstance(o, httpx.Response))


def test_scrapes_refused_every_tick_leave_no_cycles_piling_up(
    tmp_path: Path, metrics_target: Target_
) -> None:
    """A scrape cut partway leaves reference cycles in httpx, httpcore and asyncio (about
    200 KB each) that only the cyclic collector frees; under the sidecar's schedule a young
    collection waits for 50,000 allocations, so a target refused every second piled up about
    400 of them (RssAnon +76 MB). Here the collector is off, as if its turn never came: the
    scraper's own collection after each failed scrape must free them."""
    metrics_target.handler = metrics_target.endless()
    store = open_store(tmp_path / "scrape.duckdb")
    metrics = SidecarMetrics(CollectorRegistry())
    scraper = Scraper([Target(metrics_target.url, "vllm", "pod-a")],
                      Writer(store, metrics=metrics), metrics, interval_s=0.05, timeout_s=5.0,
                      sample_limit=100)  # fmt: skip

    async def start() -> None:
        scraper.start()

    gc.collect()
    before = _responses_alive()
    gc.disable()
    try:
        metrics_target.lt.call(start())
        wait_for(lambda: metrics_target.hits >= 20, timeout=120, what="20 refused scrapes")
        left = _responses_alive() - before
        for _ in range(300):  # the scrape in flight may hold one or two
            if left <= 2:
                break
            time.sleep(0.2)
            left = _responses_alive() - before
    finally:
        metrics_target.lt.call(scraper.stop())
        gc.enable()
        store.close()
    assert left <= 2, f"{left} responses of refused scrapes still in memory"


def test_a_scrape_loop_stops_when_the_stop_arrives_as_its_fetch_ends(tmp_path: Path) -> None:
    """The stop's cancellation lands between a fetch's end and the loop's next step (likelier
    the busier the event loop): it ends the loop, not one scrape. ``asyncio.wait_for`` on 3.11
    swallows it (returning the fetch's outcome): the loop scraped on while ``stop()`` waited
    for it. Driven step by step: each fetch asks for the cancellation as it ends."""
    store = open_store(tmp_path / "scrape.duckdb")
    metrics = SidecarMetrics(CollectorRegistry())
    target = Target("http://127.0.0.1:9/metrics", "vllm", "pod-a")
    scraper = Scraper([target], Writer(store, metrics=metrics), metrics, interval_s=0.01)
    fetches = 0

    async def run() -> asyncio.Task[None]:
        loop_task: asyncio.Task[None] | None = None

        async def fetch(_: Target) -> bytes:
            nonlocal fetches
            fetches += 1
            assert loop_task is not None
            asyncio.get_running_loop().call_soon(loop_task.cancel)  # the stop, as it ends
            raise ScrapeFailed("down", "refused")

        scraper._fetch = fetch  # type: ignore[method-assign]
        loop_task = asyncio.create_task(scraper._loop(target))
        while not loop_task.done() and fetches < 5:  # bounded by fetches, not by time
            await asyncio.sleep(0.01)
        loop_task.cancel()  # were it still running
        await asyncio.gather(loop_task, return_exceptions=True)
        await scraper._client.aclose()
        return loop_task

    try:
        task = asyncio.run(run())
    finally:
        store.close()
    assert task.cancelled()
    assert fetches == 1, f"the loop scraped {fetches} times after its stop"


def test_an_endless_body_is_read_no_further_than_the_limit(
    tmp_path: Path, metrics_target: Target_
) -> None:
    limit = 1 << 20
    metrics_target.handler = metrics_target.endless()
    health = _scrape(tmp_path, metrics_target, body_limit_bytes=limit, sample_limit=0)
    assert health.error is not None and health.error.startswith("body_size_limit")
    wait_for(lambda: metrics_target.sent == _after(0.2, lambda: metrics_target.sent),
             what="the target to stop writing")  # fmt: skip
    # the limit plus what the two sockets' buffers took; unbounded if read until the timeout
    print(f"endless body: the target wrote {metrics_target.sent / 2**20:.1f} MiB, limit 1 MiB")
    assert metrics_target.sent < limit + 32 * 2**20


@pytest.mark.parametrize("over", [0, 1], ids=["at-the-limit", "one-over"])
def test_the_sample_limit_counts_samples_not_comments_or_blank_lines(
    tmp_path: Path, metrics_target: Target_, vllm_fixtures: Path, over: int
) -> None:
    body = (vllm_fixtures / "metrics_after_load.prom").read_bytes()
    body = body.replace(b"\n# TYPE", b"\n\n# TYPE")  # blank lines too
    limit = sample_lines(body) - over
    metrics_target.handler = metrics_target.serve(body)
    health = _scrape(tmp_path, metrics_target, sample_limit=limit)
    assert health.up is (over == 0), health.error


def test_a_gzip_exposition_within_the_limits_is_scraped(
    tmp_path: Path, metrics_target: Target_, vllm_fixtures: Path
) -> None:
    body = (vllm_fixtures / "metrics_after_load.prom").read_bytes()
    metrics_target.handler = metrics_target.serve(
        gzip.compress(body), **{"Content-Encoding": "gzip"}
    )
    health = _scrape(tmp_path, metrics_target, body_limit_bytes=len(body))
    assert health.up, health.error
    assert health.samples == 1


@pytest.mark.parametrize("cut", [1000, 20_000], ids=["two-members", "member-boundary-late"])
def test_a_gzip_body_of_several_members_is_scraped_whole(
    tmp_path: Path, metrics_target: Target_, vllm_fixtures: Path, cut: int
) -> None:
    """gzip allows several members one after the other (RFC 1952), as Go's reader does."""
    body = (vllm_fixtures / "metrics_after_load.prom").read_bytes()
    members = gzip.compress(body[:cut]) + gzip.compress(body[cut:])
    metrics_target.handler = metrics_target.serve(members, **{"Content-Encoding": "gzip"})
    health = _scrape(tmp_path, metrics_target, body_limit_bytes=len(body))
    assert health.up, health.error
    assert health.samples == 1


@pytest.mark.parametrize("after", [b"JUNKJUNK", b"\n", b"\x1f"], ids=["junk", "newline", "half"])
def test_bytes_after_the_gzip_body_fail_the_scrape_as_garbage(
    tmp_path: Path, metrics_target: Target_, vllm_fixtures: Path, after: bytes
) -> None:
    """They were dropped unread: a body that goes on after its end is not the one sent."""
    body = (vllm_fixtures / "metrics_after_load.prom").read_bytes()
    served = gzip.compress(body) + after
    metrics_target.handler = metrics_target.serve(served, **{"Content-Encoding": "gzip"})
    health = _scrape(tmp_path, metrics_target)
    assert not health.up
    assert health.error is not None and health.error.startswith("garbage:"), health.error


# -- a huge target against a real sidecar ------------------------------------------------------
def test_a_target_with_200k_series_is_refused_whole_and_recorded_as_a_gap(
    start_sidecar: StartSidecar, metrics_target: Target_, huge: bytes
) -> None:
    metrics_target.handler = metrics_target.serve(huge)
    sc = start_sidecar(vllm_urls=(metrics_target.url,), scrape_interval_s=0.5)
    url = metrics_target.url
    wait_for(lambda: scrape_failures(sc, url, "sample_limit") >= 2, timeout=20, what="refusals")
    assert sc.value("slokit_scrape_up", target=url, kind="vllm", replica="test-pod") == 0
    gap_sql = f"SELECT up, error FROM scrapes WHERE target = '{url}'"
    wait_for(lambda: len(store_rows(sc, gap_sql)) >= 2, timeout=20, what="gaps recorded")
    assert all(not up and error.startswith("sample_limit") for up, error in store_rows(sc, gap_sql))
    assert store_rows(sc, "SELECT count(*) FROM engine_samples") == [(0,)]


def test_healthz_and_otlp_answer_while_a_200k_series_target_is_scraped(
    start_sidecar: StartSidecar, metrics_target: Target_, huge: bytes, export_body: bytes
) -> None:
    metrics_target.handler = metrics_target.serve(huge)
    sc = start_sidecar(vllm_urls=(metrics_target.url,), scrape_interval_s=0.5)
    latencies, codes = _poll_while(sc, lambda: metrics_target.hits >= 6, export_body)
    print(f"/healthz during 6 scrapes of 200k series: max {max(latencies) * 1000:.0f} ms "
          f"over {len(latencies)} polls; OTLP codes {sorted(set(codes))}")  # fmt: skip
    assert max(latencies) < 5.0  # the old on-loop parse: 7-14 s; the goal: well under 1 s
    assert codes and set(codes) == {200}


def test_scrapes_succeed_again_once_the_huge_target_recovers(
    start_sidecar: StartSidecar, metrics_target: Target_, huge: bytes, vllm_fixtures: Path
) -> None:
    metrics_target.handler = metrics_target.serve(huge)
    sc = start_sidecar(vllm_urls=(metrics_target.url,), scrape_interval_s=0.3)
    url = metrics_target.url
    wait_for(lambda: scrape_failures(sc, url, "sample_limit") >= 1, timeout=20, what="refusal")
    metrics_target.handler = metrics_target.serve(
        (vllm_fixtures / "metrics_after_load.prom").read_bytes()
    )
    wait_for(lambda: store_rows(sc, "SELECT count(*) FROM engine_samples")[0][0] >= 2, timeout=20,
             what="samples after recovery")  # fmt: skip
    assert sc.value("slokit_scrape_up", target=url, kind="vllm", replica="test-pod") == 1


def test_parsing_a_big_exposition_does_not_block_healthz(
    start_sidecar: StartSidecar, metrics_target: Target_, export_body: bytes
) -> None:
    """No sample limit: 60k series are parsed and stored (seconds a scrape), in a worker
    thread. On the loop, the poll in flight when a scrape began would wait for all of it;
    the bound is half the sidecar's own duration of a scrape, as stretched as the poll's by
    whatever else the machine runs."""
    series = 60_000
    metrics_target.handler = metrics_target.serve(exposition(series))
    sc = start_sidecar(vllm_urls=(metrics_target.url,), scrape_interval_s=1.0,
                       scrape_sample_limit=0)  # fmt: skip
    wait_for(lambda: metrics_target.hits >= 1, timeout=10, what="first scrape")
    # poll until a scrape that began after the polling did is parsed and stored
    want = series * (metrics_target.hits + 1)
    latencies, codes = _poll_while(
        sc, lambda: store_rows(sc, "SELECT count(*) FROM engine_samples")[0][0] >= want, export_body,
        timeout=90,
    )  # fmt: skip
    parse_s = sc.value("slokit_scrape_duration_seconds", target=metrics_target.url, kind="vllm")
    print(f"/healthz while parsing {series} series ({parse_s:.1f} s a scrape): max "
          f"{max(latencies) * 1000:.0f} ms over {len(latencies)} polls")  # fmt: skip
    assert set(codes) == {200}
    assert max(latencies) < parse_s / 2  # on the loop it would take the whole scrape


def _after(seconds: float, value: Callable[[], int]) -> int:
    time.sleep(seconds)
    return value()


def _poll_while(
    sc: Running, until: Callable[[], bool], export_body: bytes, timeout: float = 30.0
) -> tuple[list[float], list[int]]:
    """Poll /healthz and send an OTLP export every 50 ms until ``until()``: latencies, codes."""
    latencies: list[float] = [0.0]
    codes: list[int] = []
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=30) as client:
        while not until():
            assert time.monotonic() < deadline, f"timed out; /healthz max {max(latencies)} s"
            t = time.perf_counter()
            assert client.get(f"{sc.api}/healthz").status_code == 200
            latencies.append(time.perf_counter() - t)
            if len(latencies) % 5 == 0:
                body, _ = relabel(export_body, f"during{len(latencies)}")
                codes.append(post(sc.otlp, body).status_code)
            time.sleep(0.05)
    return latencies, codes
