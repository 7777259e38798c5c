"""Virtual time (slokit.lab.sim.vtime): sleeps jump, I/O is instant, CPU work is free, and
the engine on the event loop keeps the roofline's timeline exactly."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from slokit.lab.sim.engine import (
    EngineConfig,
    EngineCore,
    EngineLoop,
    SimRequest,
    make_request,
    simulate,
)
from slokit.lab.sim.faults import Faults
from slokit.lab.sim.openai_wire import ApiError
from slokit.lab.sim.replica import Replica
from slokit.lab.sim.roofline import GPUS, MODELS, Roofline
from slokit.lab.sim.settings import SimSettings
from slokit.lab.sim.vtime import DEFAULT_EPOCH, LoopClock, VirtualTimeLoop, run_virtual


def test_an_hour_of_sleep_passes_at_once_on_virtual_time() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(3600)
        return t0, loop.time()

    wall = time.perf_counter()
    t0, t1 = run_virtual(main())
    assert t1 - t0 == pytest.approx(3600)
    assert time.perf_counter() - wall < 60  # a real-time loop would take the hour


def test_the_loop_clock_starts_at_its_epoch_and_follows_sleeps() -> None:
    async def main() -> list[float]:
        clock = LoopClock(epoch=1_000.0)
        seen = [clock.now()]
        await clock.sleep(2.5)
        seen.append(clock.now())
        await clock.sleep_until(1_010.0)
        seen.append(clock.now())
        return seen

    assert run_virtual(main()) == pytest.approx([1_000.0, 1_002.5, 1_010.0], abs=1e-9)


def test_the_default_epoch_is_fixed_and_in_the_past() -> None:
    async def main() -> float:
        return LoopClock().now()

    assert run_virtual(main()) == DEFAULT_EPOCH
    assert time.time() > DEFAULT_EPOCH


def test_timeouts_fire_at_their_virtual_deadline() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.sleep(10)
        return loop.time() - t0

    assert run_virtual(main()) == pytest.approx(5)


def test_timers_fire_in_order_of_their_virtual_deadlines() -> None:
    async def main() -> list[int]:
        order: list[int] = []

        async def after(delay: float, tag: int) -> None:
            await asyncio.sleep(delay)
            order.append(tag)

        await asyncio.gather(*(after(d, t) for t, d in enumerate([0.3, 0.1, 0.2, 0.1001])))
        return order

    assert run_virtual(main()) == [1, 3, 2, 0]


def test_a_loopback_http_exchange_takes_no_virtual_time() -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    async def main() -> tuple[str, float]:
        app = web.Application()
        app.router.add_get("/", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        loop = asyncio.get_running_loop()
        try:
            async with aiohttp.ClientSession() as http:
                t0 = loop.time()
                async with http.get(f"http://127.0.0.1:{port}/") as resp:
                    body = await resp.text()
                return body, loop.time() - t0
        finally:
            await runner.cleanup()

    body, elapsed = run_virtual(main())
    assert body == "hi"
    assert elapsed == 0.0


def _core(max_num_seqs: int = 4) -> EngineCore:
    cfg = EngineConfig(num_gpu_blocks=4096, max_num_batched_tokens=2048, max_num_seqs=max_num_seqs)
    return EngineCore(cfg, Roofline(MODELS["7b"], GPUS["l4"]))


def _requests() -> list[tuple[float, SimRequest]]:
    """Staggered arrivals, more than the batch holds: queueing, chunking, decodes."""
    return [
        (0.05 * i, make_request(f"r{i}", [i * 7919 + j for j in range(100 + 300 * (i % 3))], 24))
        for i in range(10)
    ]


def _times(reqs: list[SimRequest]) -> list[float]:
    out = []
    for r in reqs:
        assert r.scheduled_time is not None and r.last_token_time is not None
        assert r.first_token_time is not None
        out += [r.scheduled_time, r.first_token_time, r.last_token_time]
    return out


async def _on_the_loop(arrivals: list[tuple[float, SimRequest]], burn_s: float) -> None:
    """The engine as the server runs it (EngineLoop on the loop's clock), with arrivals
    submitted by a task at their times; a neighbour task burns ``burn_s`` of CPU every
    5 ms of virtual time, as a loaded host would steal it."""
    clock = LoopClock(epoch=0.0)
    engine = EngineLoop(_core(), clock)
    engine.start()
    stop = asyncio.Event()

    async def neighbour() -> None:
        while not stop.is_set():
            end = time.perf_counter() + burn_s
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(0.005)

    hog = asyncio.get_running_loop().create_task(neighbour())
    try:
        for at, req in arrivals:
            await clock.sleep_until(at)
            req.arrival_time = at
            engine.submit(req)
        while not all(r.finished for _, r in arrivals):
            await clock.sleep(0.01)
    finally:
        stop.set()
        await hog
        await engine.stop()


@pytest.mark.parametrize("burn_s", [0.0, 0.0005], ids=["idle", "cpu-hog"])
def test_the_engine_loop_on_virtual_time_keeps_the_roofline_timeline(burn_s: float) -> None:
    expected = _requests()
    simulate(_core(), expected)
    actual = _requests()
    run_virtual(_on_the_loop(actual, burn_s))
    assert _times([r for _, r in actual]) == pytest.approx(
        _times([r for _, r in expected]), abs=1e-9
    )


def test_run_virtual_runs_on_a_virtual_time_loop() -> None:
    async def main() -> bool:
        return isinstance(asyncio.get_running_loop(), VirtualTimeLoop)

    assert run_virtual(main())


_BODY = {"prompt": "one two three four five six seven", "max_tokens": 12, "stream": True}


async def _http_token_times(replica: Replica, headers: dict[str, str]) -> list[float]:
    """Seconds from sending to each streamed token, read by a real client over HTTP."""
    clock = replica.clock
    out: list[float] = []
    async with aiohttp.ClientSession() as http:
        t0 = clock.now()
        url = f"http://127.0.0.1:{replica.port}/v1/completions"
        async with http.post(url, json=_BODY, headers=headers) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: {") and b'"text"' in line:
                    out.append(clock.now() - t0)
    return out


async def _in_process_token_times(replica: Replica, headers: dict[str, str]) -> list[float]:
    clock = replica.clock
    out: list[float] = []
    t0 = clock.now()

    def on_tokens(req: SimRequest) -> None:
        out.extend([clock.now() - t0] * req.new_tokens)
        req.new_tokens = 0

    req = await replica.generate_in_process("completion", _BODY, headers, on_tokens)
    assert req.finish_reason == "length"
    return out


async def _on_a_replica(how: str, settings: SimSettings) -> list[float]:
    replica = Replica(settings, 0, 0, None, clock=LoopClock())
    await replica.start()
    try:
        fn = _http_token_times if how == "http" else _in_process_token_times
        return await fn(replica, {"X-Request-Id": "r1"})
    finally:
        await replica.stop()


@pytest.mark.parametrize(
    "settings",
    [SimSettings(gpu="l4"), SimSettings(gpu="l4", faults=Faults(frontend_delay_s=0.02))],
    ids=["healthy", "frontend-delay"],
)
def test_in_process_generation_times_tokens_as_the_http_stream_does(
    settings: SimSettings,
) -> None:
    over_http = run_virtual(_on_a_replica("http", settings))
    in_process = run_virtual(_on_a_replica("in-process", settings))
    assert len(over_http) == 12
    assert in_process == pytest.approx(over_http, abs=1e-9)


def test_in_process_generation_raises_the_status_the_server_would_answer() -> None:
    async def main() -> list[tuple[int, str]]:
        replica = Replica(SimSettings(faults=Faults(error_rate=1.0)), 0, 0, None, clock=LoopClock())
        seen = []
        for body in ({"prompt": "hi", "max_tokens": 0}, _BODY):
            with pytest.raises(ApiError) as err:
                await replica.generate_in_process("completion", body, {}, lambda r: None)
            seen.append((err.value.status, err.value.err_type))
        return seen

    assert run_virtual(main()) == [(400, "BadRequestError"), (500, "InternalServerError")]
