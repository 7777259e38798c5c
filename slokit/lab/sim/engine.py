"""Iteration-level engine model: a vLLM V1-style scheduler over paged KV blocks.

Each call of :meth:`EngineCore.schedule` plans one engine step (one forward pass):

1. Running requests first, in order: a decode needs 1 token (``1 + k`` with ``k``
   speculative drafts), a partly prefilled prompt needs the rest of its prompt, cut to
   the remaining token budget (``max_num_batched_tokens``) -- chunked prefill with
   decodes first. When the KV pool cannot hold a running request's new tokens the
   *last* running request is preempted (its blocks freed, recomputed later from the
   front of the waiting queue) until it fits: vLLM's preemption by recompute.
2. Then, if nothing was preempted, waiting requests in FCFS order while
   ``len(running) < max_num_seqs`` and budget is left; a new request first takes its
   prefix-cache hit (full blocks whose chained hashes match), then allocates blocks for
   the rest (or its first chunk).

The step's duration comes from :class:`~slokit.lab.sim.roofline.Roofline`; when it ends
(:meth:`EngineCore.complete`) every request whose known tokens are all computed samples
one new token (``1 + accepted drafts`` under speculative decoding), full blocks are
added to the prefix cache, and finished requests free their blocks.

Timing fields follow vLLM's request stats: ``arrival_time`` (frontend received it),
``queued_time`` (engine received it), ``scheduled_time`` (first scheduled),
``first_token_time``, ``last_token_time``; queue = scheduled - queued, prefill =
first token - scheduled, decode = last token - first token, TTFT = first token - arrival.

The core is synchronous and takes times as arguments, so tests drive it on fake time
(:func:`simulate`); :class:`EngineLoop` runs it on an asyncio loop against a
:class:`~slokit.lab.sim.clock.Clock` (``WallClock(speed)`` in the server).

Sampled tokens come from the deterministic vocabulary of :mod:`slokit.lab.sim.tokens`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from slokit.lab.sim.clock import Clock
from slokit.lab.sim.kv import KVCacheManager, chain_hashes
from slokit.lab.sim.roofline import Roofline
from slokit.lab.sim.tokens import VOCAB_IDS, output_index


@dataclass
class EngineConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    num_gpu_blocks: int = 4096
    block_size: int = 16
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    seed: int = 0


@dataclass(eq=False)
class SimRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    output_len: int
    arrival_time: float
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int = 0
    notify: Callable[[], None] | None = None
    meta: Any = None  # the frontend's own data (response ids, trace parent)
    # engine state
    token_ids: list[int] = field(default_factory=list)
    num_output: int = 0
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    num_preemptions: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first admission; -1 = not admitted yet
    queued_time: float = 0.0
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: str | None = None  # length | stop | abort | error
    new_tokens: int = 0  # produced since the consumer last looked

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class SpecStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


@dataclass
class Step:
    start: float
    duration_s: float  # GPU-busy time of the forward pass (with overhead)
    idle_after_s: float  # CPU gap before the next step (frontend/scheduler starvation)
    scheduled: list[tuple[SimRequest, int, int]]  # (request, new tokens, draft tokens)
    num_tokens: int
    kv_tokens_read: int
    num_preempted: int
    flops: float
    read_bytes: float
    write_bytes: float
    clock_ratio: float


@dataclass
class StepStats:
    """What a completed step reports to listeners (metrics, GPU model)."""

    start: float
    end: float
    gpu_busy_s: float
    num_tokens: int
    num_preempted: int
    num_generation_tokens: int
    num_running: int
    num_waiting: int
    kv_usage: float
    kv_blocks_used: int
    flops: float
    read_bytes: float
    write_bytes: float
    clock_ratio: float
    spec: SpecStats | None
    first_tokens: list[SimRequest]  # requests that got their first token in this step
    # (request, tokens emitted, inter-token latency or None for the first token)
    token_events: list[tuple[SimRequest, int, float | None]]
    finished: list[SimRequest]


class EngineListener(Protocol):
    def on_step(self, stats: StepStats) -> None: ...

    def on_finish(self, req: SimRequest) -> None: ...


class EngineCore:
    def __init__(self, config: EngineConfig, roofline: Roofline):
        self.config = config
        self.roofline = roofline
        self.kv = KVCacheManager(
            config.num_gpu_blocks, config.block_size, config.enable_prefix_caching
        )
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.listeners: list[EngineListener] = []
        self.clock_ratio = 1.0
        self.step_gap_s = 0.0
        self.spec_k = 0
        self.spec_acceptance = 0.0
        self._rng = random.Random(config.seed)

    # ---- knobs ----------------------------------------------------------------------
    def set_spec_decode(self, num_speculative_tokens: int, acceptance_rate: float) -> None:
        self.spec_k = num_speculative_tokens
        self.spec_acceptance = acceptance_rate

    def set_prefix_caching(self, enabled: bool) -> None:
        self.kv.enable_prefix_caching = enabled
        if not enabled:
            self.kv.reset_prefix_cache()

    # ---- requests -------------------------------------------------------------------
    def add(self, req: SimRequest, now: float) -> None:
        req.queued_time = now
        req.block_hashes = chain_hashes(req.token_ids, self.config.block_size, 0, 0)
        self.waiting.append(req)

    def abort(self, req: SimRequest, now: float, reason: str = "abort") -> None:
        if req.finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req.blocks)
        req.finish_reason = reason
        req.finish_time = now
        for listener in self.listeners:
            listener.on_finish(req)

    def fail_all(self, now: float) -> list[SimRequest]:
        """Crash: every unfinished request ends with reason ``error``."""
        victims = list(self.running) + list(self.waiting)
        for req in victims:
            self.kv.free(req.blocks)
            req.finish_reason = "error"
            req.finish_time = now
            if req.notify is not None:
                req.notify()
        self.running.clear()
        self.waiting.clear()
        return victims

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ---- scheduling -----------------------------------------------------------------
    def _preempt_last(self) -> SimRequest:
        victim = self.running.pop()
        self.kv.free(victim.blocks)
        victim.num_computed = 0
        victim.num_cached_blocks = 0
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def schedule(self, now: float) -> Step | None:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int, int]] = []
        num_preempted = 0
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            base = req.num_tokens - req.num_computed
            draft = 0
            if self.spec_k and base == 1 and req.output_len - req.num_output > 1:
                draft = self.spec_k
            num_new = min(base + draft, budget)
            draft = max(0, num_new - base)
            fitted = True
            while not self.kv.allocate(req.blocks, (), req.num_computed + num_new):
                victim = self._preempt_last()
                num_preempted += 1
                if victim is req:
                    fitted = False
                    break
            if not fitted:
                break
            scheduled.append((req, num_new, draft))
            budget -= num_new
            i += 1
        if num_preempted == 0:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self.waiting[0]
                hit: list[int] = []
                if req.num_computed == 0:
                    max_hit = (req.num_tokens - 1) // cfg.block_size
                    hit = self.kv.lookup(req.block_hashes, max_hit)
                computed = len(hit) * cfg.block_size
                num_new = min(req.num_tokens - computed, budget)
                if not self.kv.allocate(req.blocks, hit, computed + num_new):
                    break
                self.waiting.popleft()
                req.num_computed = computed
                req.num_cached_blocks = len(hit)
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = computed
                if req.scheduled_time is None:
                    req.scheduled_time = max(now, req.queued_time)
                self.running.append(req)
                scheduled.append((req, num_new, 0))
                budget -= num_new
        if not scheduled:
            return None
        num_tokens = sum(n for _, n, _ in scheduled)
        kv_read = sum(r.num_computed for r, _, _ in scheduled)
        rl = self.roofline
        return Step(
            start=now,
            duration_s=rl.step_seconds(num_tokens, kv_read, self.clock_ratio),
            idle_after_s=self.step_gap_s,
            scheduled=scheduled,
            num_tokens=num_tokens,
            kv_tokens_read=kv_read,
            num_preempted=num_preempted,
            flops=rl.flops(num_tokens),
            read_bytes=rl.read_bytes(kv_read),
            write_bytes=rl.write_bytes(num_tokens),
            clock_ratio=self.clock_ratio,
        )

    def complete(self, step: Step, end: float) -> StepStats:
        bs = self.config.block_size
        spec = SpecStats(accepted_per_pos=[0] * self.spec_k) if self.spec_k else None
        first: list[SimRequest] = []
        events: list[tuple[SimRequest, int, float | None]] = []
        finished: list[SimRequest] = []
        generated = 0
        for req, num_new, draft in step.scheduled:
            if req.finished:  # aborted while the step ran
                continue
            base = req.num_tokens - req.num_computed
            if num_new < base:  # a prefill chunk: no token yet
                req.num_computed += num_new
            else:
                accepted = 0
                if draft and spec is not None:
                    spec.num_drafts += 1
                    spec.num_draft_tokens += draft
                    while accepted < draft and self._rng.random() < self.spec_acceptance:
                        spec.accepted_per_pos[accepted] += 1
                        accepted += 1
                    spec.num_accepted_tokens += accepted
                emitted = min(1 + accepted, req.output_len - req.num_output)
                for _ in range(emitted):
                    req.token_ids.append(VOCAB_IDS[output_index(req.seed, req.num_output)])
                    req.num_output += 1
                req.num_computed = req.num_tokens - 1
                # a request that arrived after a lagging step began keeps causal times
                t = end if req.scheduled_time is None else max(end, req.scheduled_time)
                itl = None if req.last_token_time is None else t - req.last_token_time
                if req.first_token_time is None:
                    req.first_token_time = t
                    first.append(req)
                req.last_token_time = t
                req.new_tokens += emitted
                generated += emitted
                events.append((req, emitted, itl))
            full = req.num_computed // bs
            if full > len(req.block_hashes):
                parent = req.block_hashes[-1] if req.block_hashes else 0
                req.block_hashes.extend(
                    chain_hashes(req.token_ids[: full * bs], bs, len(req.block_hashes), parent)
                )
            if full > req.num_cached_blocks:
                self.kv.cache_blocks(req.blocks, req.block_hashes[:full], req.num_cached_blocks)
                req.num_cached_blocks = full
            if req.num_output >= req.output_len:
                req.finish_reason = "length" if req.output_len >= req.max_tokens else "stop"
                req.finish_time = req.last_token_time
                finished.append(req)
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
            for req in finished:
                self.kv.free(req.blocks)
        stats = StepStats(
            start=step.start,
            end=end,
            gpu_busy_s=step.duration_s,
            num_tokens=step.num_tokens,
            num_preempted=step.num_preempted,
            num_generation_tokens=generated,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_usage=self.kv.usage,
            kv_blocks_used=self.kv.blocks_in_use,
            flops=step.flops,
            read_bytes=step.read_bytes,
            write_bytes=step.write_bytes,
            clock_ratio=step.clock_ratio,
            spec=spec,
            first_tokens=first,
            token_events=events,
            finished=finished,
        )
        for listener in self.listeners:
            listener.on_step(stats)
        for req in finished:
            for listener in self.listeners:
                listener.on_finish(req)
        for req, _, _ in events:
            if req.notify is not None:
                req.notify()
        return stats


def simulate(
    core: EngineCore, arrivals: Iterable[tuple[float, SimRequest]], start: float = 0.0
) -> list[StepStats]:
    """Run ``core`` on fake time until every request has finished (no sleeping).

    ``arrivals`` are (time, request) pairs; a request's ``arrival_time`` is set to its time."""
    pending = deque(sorted(arrivals, key=lambda a: a[0]))
    t = start
    steps: list[StepStats] = []
    while pending or core.has_work:
        while pending and pending[0][0] <= t:
            at, req = pending.popleft()
            req.arrival_time = at
            core.add(req, at)
        step = core.schedule(t)
        if step is None:
            if not pending:
                break  # nothing can run: only possible with a pool too small for one request
            t = max(t, pending[0][0])
            continue
        end = t + step.duration_s
        steps.append(core.complete(step, end))
        t = end + step.idle_after_s
    return steps


class EngineLoop:
    """Runs an :class:`EngineCore` as one asyncio task against a :class:`Clock`."""

    def __init__(self, core: EngineCore, clock: Clock, max_lag_s: float = 0.005):
        self.core = core
        self.clock = clock
        self.max_lag_s = max_lag_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def submit(self, req: SimRequest) -> None:
        self.core.add(req, self.clock.now())
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        """Steps back to back on an ideal timeline: each step ends ``duration`` after the
        previous one, so timer granularity does not stretch every step. When the process
        falls behind by more than ``max_lag_s`` (CPU starved), the timeline resyncs to now
        and the lost time shows as latency, as on a real overloaded server."""
        core, clock = self.core, self.clock
        cursor: float | None = None
        while True:
            now = clock.now()
            if cursor is None or now - cursor > self.max_lag_s:
                cursor = now
            step = core.schedule(cursor)
            if step is None:
                cursor = None
                self._wake.clear()
                await self._wake.wait()
                continue
            end = cursor + step.duration_s
            wait = end - clock.now()
            if wait > 0:
                await clock.sleep(wait)
            else:
                await asyncio.sleep(0)
            core.complete(step, end)
            cursor = end + step.idle_after_s
            if step.idle_after_s > 0:
                await clock.sleep(cursor - clock.now())


def make_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    max_tokens: int,
    output_len: int | None = None,
    arrival_time: float = 0.0,
    seed: int = 0,
) -> SimRequest:
    return SimRequest(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        max_tokens=max_tokens,
        output_len=max_tokens if output_len is None else output_len,
        arrival_time=arrival_time,
        seed=seed,
    )
