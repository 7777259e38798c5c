"""Synthetic stores for the rule tests: records built from functions of time.

Every knob is a constant or a function of the time ``t`` (epoch seconds), so a test reads as
"this is normal until INCIDENT, then this changes". Counters are integrated from rates, as
vLLM would expose them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slokit.records import EngineSample, GpuSample, RequestFragment, ScrapeResult

Run = Callable[..., dict[str, Any]]

T0 = 1_795_958_000.0
END = T0 + 600.0  # ten minutes of data
INCIDENT = T0 + 300.0  # the baseline (first 150 s) is quiet; trouble starts here

Knob = float | Callable[[float], float]


def val(x: Knob, t: float) -> float:
    return float(x(t)) if callable(x) else float(x)


def after(t0: float, before: float, then: float) -> Callable[[float], float]:
    """``before`` until ``t0``, ``then`` from it."""
    return lambda t: then if t >= t0 else before


def ramp(t0: float, t1: float, a: float, b: float) -> Callable[[float], float]:
    """``a`` until ``t0``, linear to ``b`` at ``t1``, ``b`` after."""

    def f(t: float) -> float:
        if t <= t0:
            return a
        if t >= t1:
            return b
        return a + (b - a) * (t - t0) / (t1 - t0)

    return f


def _times(start: float, end: float, every: Knob) -> list[float]:
    out, t = [], start
    while t < end:
        out.append(t)
        t += val(every, t)
    return out


def requests(
    replica: str | None = "pod-a",
    *,
    start: float = T0,
    end: float = END,
    every_s: Knob = 0.5,
    queue_s: Knob = 0.02,
    prefill_s: Knob = 0.05,
    frontend_s: Knob = 0.0,
    tpot_s: Knob = 0.02,
    prompt_tokens: Knob = 200,
    output_tokens: Knob = 100,
    error_every: Knob = 0,
    prefix: str = "r",
    spans: bool = True,
    finish: bool = True,
) -> list[RequestFragment]:
    """One request every ``every_s``; ``error_every=n`` makes every n-th one fail (500)."""
    out = []
    for i, t in enumerate(_times(start, end, every_s)):
        q, p, fe = val(queue_s, t), val(prefill_s, t), val(frontend_s, t)
        n_out = int(val(output_tokens, t))
        tpot = val(tpot_s, t)
        ttft = fe + q + p
        decode = tpot * (n_out - 1)
        err_n = int(val(error_every, t))
        failed = err_n > 0 and i % err_n == 0
        rid = f"{prefix}-{replica}-{i}"
        kw: dict[str, Any] = {}
        if failed:
            kw = {
                "status": "error",
                "http_status": 500,
                "error_type": "InternalServerError",
                "finish_ts": t + ttft if finish else None,
            }
        else:
            kw = {
                "status": "ok",
                "ttft_s": ttft,
                "tpot_s": tpot,
                "e2e_s": ttft + decode,
                "decode_s": decode,
                "output_tokens": n_out,
                "first_token_ts": t + ttft,
                "finish_ts": (t + ttft + decode) if finish else None,
            }
            if spans:
                kw.update(queue_s=q, prefill_s=p)
        out.append(
            RequestFragment(
                request_id=rid,
                source="vllm" if spans else "client",
                fragment_id=f"f:{rid}",
                replica=replica,
                model="m",
                arrival_ts=t,
                prompt_tokens=int(val(prompt_tokens, t)),
                **kw,
            )
        )
    return out


def engine(
    replica: str = "pod-a",
    *,
    start: float = T0,
    end: float = END,
    every_s: float = 1.0,
    running: Knob = 8,
    waiting: Knob = 0,
    kv: Knob = 0.3,
    preemptions_per_s: Knob = 0,
    successes_per_s: Knob = 2,
    prompt_tokens_per_s: Knob = 400,
    prefix_queries_per_s: Knob = 400,
    prefix_hit_ratio: Knob = 0.6,
    spec_drafts_per_s: Knob = 0,
    spec_k: Knob = 4,
    spec_accepted_per_draft: Knob = 2.0,
    reset_at: float | None = None,
) -> list[EngineSample]:
    out = []
    c = dict.fromkeys(("pre", "succ", "prompt", "pq", "ph", "sd", "sdt", "sa"), 0.0)
    spec = val(spec_drafts_per_s, start) > 0 or callable(spec_drafts_per_s)
    for t in _times(start, end, every_s):
        if reset_at is not None and t >= reset_at > t - every_s:
            c = dict.fromkeys(c, 0.0)
        dt = every_s
        pq = val(prefix_queries_per_s, t) * dt
        sd = val(spec_drafts_per_s, t) * dt
        c["pre"] += val(preemptions_per_s, t) * dt
        c["succ"] += val(successes_per_s, t) * dt
        c["prompt"] += val(prompt_tokens_per_s, t) * dt
        c["pq"] += pq
        c["ph"] += pq * val(prefix_hit_ratio, t)
        c["sd"] += sd
        c["sdt"] += sd * val(spec_k, t)
        c["sa"] += sd * val(spec_accepted_per_draft, t)
        out.append(
            EngineSample(
                ts=t,
                replica=replica,
                model="m",
                running=val(running, t),
                waiting=val(waiting, t),
                kv_usage_ratio=val(kv, t),
                preemptions_total=round(c["pre"]),
                request_success_total=c["succ"],
                prompt_tokens_total=c["prompt"],
                generation_tokens_total=c["succ"] * 100,
                prefix_cache_queries_total=c["pq"],
                prefix_cache_hits_total=c["ph"],
                spec_decode_drafts_total=c["sd"] if spec else None,
                spec_decode_draft_tokens_total=c["sdt"] if spec else None,
                spec_decode_accepted_tokens_total=c["sa"] if spec else None,
            )
        )
    return out


def gpu(
    replica: str = "pod-a",
    *,
    start: float = T0,
    end: float = END,
    every_s: float = 1.0,
    util: Knob = 0.8,
    clock: Knob = 1980,
    power: Knob = 550,
    temp: Knob = 60,
    xid: Knob = 0,
) -> list[GpuSample]:
    return [
        GpuSample(
            ts=t,
            node="node-1",
            gpu="0",
            replica=replica,
            util_ratio=val(util, t),
            sm_clock_mhz=val(clock, t),
            power_w=val(power, t),
            temperature_c=val(temp, t),
            xid_last=val(xid, t),
        )
        for t in _times(start, end, every_s)
    ]


def scrapes(
    target: str,
    replica: str,
    kind: str,
    *,
    start: float,
    end: float,
    up: Callable[[float], bool],
    every_s: float = 5.0,
) -> list[ScrapeResult]:
    return [
        ScrapeResult(
            ts=t,
            target=target,
            kind=kind,
            replica=replica,
            up=up(t),
            error=None if up(t) else "HTTP 503",
        )
        for t in _times(start, end, every_s)
    ]
