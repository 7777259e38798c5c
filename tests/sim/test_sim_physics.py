"""The engine model's physics, on fake time (no sleeping): the seed behaviours of issue 3."""

from __future__ import annotations

import asyncio

from slokit.lab.sim.clock import VirtualClock
from slokit.lab.sim.engine import (
    EngineConfig,
    EngineCore,
    EngineLoop,
    SimRequest,
    StepStats,
    make_request,
    simulate,
)
from slokit.lab.sim.roofline import GPUS, MODELS, Roofline


def _core(
    num_gpu_blocks: int = 20000, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256
) -> EngineCore:
    cfg = EngineConfig(
        num_gpu_blocks=num_gpu_blocks,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
    )
    return EngineCore(cfg, Roofline(MODELS["7b"], GPUS["h100"]))


def _prompt(n: int, salt: int = 0) -> list[int]:
    return [salt * 1_000_003 + i for i in range(n)]


def _ttft(r: SimRequest) -> float:
    assert r.first_token_time is not None
    return r.first_token_time - r.arrival_time


def _tpot(r: SimRequest) -> float:
    assert r.first_token_time is not None and r.last_token_time is not None
    return (r.last_token_time - r.first_token_time) / (r.num_output - 1)


def test_ttft_grows_with_prompt_length() -> None:
    ttfts = []
    for n in (128, 1024, 4000):
        req = make_request("r", _prompt(n), max_tokens=4)
        simulate(_core(), [(0.0, req)])
        ttfts.append(_ttft(req))
    assert ttfts[0] < ttfts[1] < ttfts[2]
    assert ttfts[2] > 5 * ttfts[0]


def test_tpot_grows_with_running_batch_size() -> None:
    tpots = []
    for batch in (1, 32, 256):
        reqs = [make_request(f"r{i}", _prompt(512, i), max_tokens=128) for i in range(batch)]
        simulate(_core(), [(0.0, r) for r in reqs])
        tpots.append(sum(_tpot(r) for r in reqs) / batch)
    assert tpots[0] < tpots[1] < tpots[2]
    assert tpots[2] > 1.5 * tpots[0]


def test_prefix_cache_hit_cuts_prefill_but_not_decode() -> None:
    core = _core()
    first = make_request("a", _prompt(3000), max_tokens=64)
    again = make_request("b", _prompt(3000), max_tokens=64)
    simulate(core, [(0.0, first), (10.0, again)])
    assert again.num_cached_tokens >= 2976  # all full blocks but the last token's
    prefill = [r.first_token_time - r.scheduled_time for r in (first, again)]  # type: ignore[operator]
    assert prefill[1] < prefill[0] / 3
    assert abs(_tpot(again) - _tpot(first)) < 0.05 * _tpot(first)


def test_too_few_kv_blocks_cause_preemptions_and_full_cache() -> None:
    core = _core(num_gpu_blocks=96)  # 1536 tokens for 16 sequences of up to 356 tokens
    reqs = [make_request(f"r{i}", _prompt(100, i), max_tokens=256) for i in range(16)]
    steps = simulate(core, [(0.0, r) for r in reqs])
    assert sum(s.num_preempted for s in steps) > 0
    assert max(s.kv_usage for s in steps) > 0.95
    assert all(r.num_output == 256 for r in reqs)
    assert any(r.num_preemptions for r in reqs)


def test_ample_kv_blocks_never_preempt() -> None:
    reqs = [make_request(f"r{i}", _prompt(100, i), max_tokens=256) for i in range(16)]
    steps = simulate(_core(), [(0.0, r) for r in reqs])
    assert sum(s.num_preempted for s in steps) == 0


def _throughput(steps: list[StepStats]) -> float:
    return sum(s.num_generation_tokens for s in steps) / (steps[-1].end - steps[0].start)


def test_continuous_batching_beats_one_sequence_at_a_time() -> None:
    def run(max_num_seqs: int) -> float:
        reqs = [make_request(f"r{i}", _prompt(256, i), max_tokens=128) for i in range(64)]
        return _throughput(simulate(_core(max_num_seqs=max_num_seqs), [(0.0, r) for r in reqs]))

    assert run(64) > 10 * run(1)


def test_chunked_prefill_keeps_decodes_going() -> None:
    core = _core(max_num_batched_tokens=512)
    decoding = make_request("d", _prompt(16), max_tokens=64)
    long_prompt = make_request("p", _prompt(4000, 1), max_tokens=4)
    steps = simulate(core, [(0.0, decoding), (0.05, long_prompt)])
    assert all(s.num_tokens <= 512 for s in steps)
    chunked = [s for s in steps if s.num_tokens == 512]
    assert len(chunked) >= 7  # the 4000-token prompt went in 512-token chunks
    assert all(any(r is decoding for r, _, _ in s.token_events) for s in chunked[:5])


def test_spec_decode_acceptance_matches_configured_rate() -> None:
    core = _core()
    core.set_spec_decode(3, 0.5)
    reqs = [make_request(f"r{i}", _prompt(64, i), max_tokens=400) for i in range(8)]
    steps = simulate(core, [(0.0, r) for r in reqs])
    drafts = sum(s.spec.num_draft_tokens for s in steps if s.spec)
    accepted = sum(s.spec.num_accepted_tokens for s in steps if s.spec)
    # P(accept position j) = 0.5 ** (j + 1): expected accepted per draft 0.875 of 3 tokens
    assert 0.25 < accepted / drafts < 0.34
    assert all(r.num_output == 400 for r in reqs)


def test_gpu_throttle_slows_steps() -> None:
    def e2e(ratio: float) -> float:
        core = _core()
        core.clock_ratio = ratio
        req = make_request("r", _prompt(2000), max_tokens=64)
        simulate(core, [(0.0, req)])
        assert req.finish_time is not None
        return req.finish_time

    assert e2e(0.4) > 1.3 * e2e(1.0)


def test_engine_loop_runs_on_virtual_clock() -> None:
    async def main() -> tuple[float, SimRequest]:
        clock = VirtualClock(start=100.0)
        loop = EngineLoop(_core(), clock)
        loop.start()
        req = make_request("r", _prompt(300), max_tokens=20, arrival_time=clock.now())
        loop.submit(req)
        while not req.finished:
            await asyncio.sleep(0)
        await loop.stop()
        return clock.now(), req

    now, req = asyncio.run(main())
    assert req.num_output == 20 and req.finish_reason == "length"
    assert req.finish_time is not None and 100.0 < req.finish_time <= now


def test_cpu_starved_engine_leaves_the_gpu_idle_between_steps() -> None:
    def busy_fraction(gap: float) -> tuple[float, float]:
        core = _core()
        core.step_gap_s = gap
        reqs = [make_request(f"r{i}", _prompt(64, i), max_tokens=64) for i in range(8)]
        steps = simulate(core, [(0.0, r) for r in reqs])
        span = steps[-1].end - steps[0].start
        return sum(s.gpu_busy_s for s in steps) / span, span

    healthy, healthy_span = busy_fraction(0.0)
    starved, starved_span = busy_fraction(0.02)
    assert healthy > 0.99 and starved < 0.4
    assert starved_span > 2 * healthy_span
