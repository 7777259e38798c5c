"""TTFT increases and where they went: shared by queue_saturation, prefill_saturation and
frontend_bound so that the three agree and never claim the same episode twice.

For each replica, buckets after the baseline whose TTFT p95 is ``ttft_factor`` times the
baseline's form an episode. The increase of the mean TTFT over the baseline is split into
engine queue time (scheduled - queued), prefill time (first token - scheduled) and frontend
time (TTFT not spent in the engine: tokenization, API server, a starved engine loop). The
episode is then classified:

* ``frontend``: frontend time carries most of the increase, or requests queue while the GPU
  sits mostly idle and the running batch did not grow (the engine is not the bottleneck);
* ``queue``: engine queue time carries the larger share and TPOT is flat;
* ``prefill``: prefill time carries the larger share, or prompts grew ``PROMPT_GROWTH``
  times and prefill carries at least a fifth (the rest is queueing behind prefills), with
  TPOT flat;
* ``queue`` also when TPOT rose but only as the batch filled under overload: queue time
  carries most of the increase, requests waited, the running batch grew ``batch_factor``
  times (in the episode's fullest bucket) or arrivals grew :data:`ARRIVAL_BURST` times, and
  TTFT rose ``ttft_factor`` times more than TPOT (on hardware whose step time grows with the
  batch, a full batch slows decode while the backlog is the story; a burst on a small batch
  cap, e.g. two sequences, keeps the batch between one and two while the rest wait);
* ``None``: TPOT rose otherwise (decode-side: other rules judge it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._util import episode, fmt_x, in_span, num, ratio

_CACHE_KEY = "_ttft_increases"
#: Prompts this many times longer than the baseline's make an episode prefill-driven.
PROMPT_GROWTH = 1.5
#: Arrivals this many times the baseline's rate make a backlog the burst's, though TPOT rose
#: (with arrivals flat, steps that slowed on their own are what made the queue).
ARRIVAL_BURST = 2.0


@dataclass
class TtftIncrease:
    replica: str
    start: float
    end: float
    base: dict[str, Any]
    ep: dict[str, Any]
    flagged_buckets: int
    detect_buckets: int
    ttft_ratio: float
    tpot_ratio: float | None
    shares: dict[str, float]
    kind: str | None
    waiting_peak: float | None = None
    waiting_base_peak: float | None = None
    running_mean: float | None = None
    running_peak: float | None = None  # the episode's fullest bucket (its mean batch)
    running_base_mean: float | None = None
    arrival_ratio: float | None = None  # the episode's arrival rate over the baseline's
    gpu_util: float | None = None
    gpu_util_base: float | None = None
    series: dict[str, Any] = field(default_factory=dict)

    @property
    def flagged_share(self) -> float:
        return self.flagged_buckets / max(1, self.detect_buckets)


def _mean(frame: Any, col: str) -> float | None:
    if frame is None or frame.empty or col not in frame:
        return None
    return num(frame[col].mean())


def _max(frame: Any, col: str) -> float | None:
    if frame is None or frame.empty or col not in frame:
        return None
    return num(frame[col].max())


def significant(base: dict[str, Any], ep: dict[str, Any], min_z: float) -> bool:
    """Is the mean TTFT shift more than ``min_z`` standard errors (Welch)? Guards the p95
    ratio against a few slow requests in a small sample."""
    mb, me = num(base.get("ttft_mean")), num(ep.get("ttft_mean"))
    if mb is None or me is None:
        return False
    se2: float = sum(
        (num(s.get("ttft_sd")) or 0.0) ** 2 / max(1, int(s.get("n") or 1)) for s in (base, ep)
    )
    return bool((me - mb) > min_z * se2**0.5)


def _note(ctx: DiagnoseContext, replica: str, why: str) -> None:
    """Why the TTFT rules say nothing about ``replica`` (in diagnose's coverage)."""
    for rule in ("queue_saturation", "prefill_saturation", "frontend_bound"):
        ctx.note(rule, f"{replica or 'fleet'}: {why}")


def ttft_increases(ctx: DiagnoseContext) -> list[TtftIncrease]:
    cached = ctx.cache.get(_CACHE_KEY)
    if cached is None:
        cached = ctx.cache[_CACHE_KEY] = _compute(ctx)
    return list(cached)


def _compute(ctx: DiagnoseContext) -> list[TtftIncrease]:
    o = ctx.options
    out: list[TtftIncrease] = []
    reqs = ctx.requests
    if reqs.empty:
        return out
    for replica in sorted(reqs["replica"].unique()):
        rows = ctx.of("requests", replica)
        base = ctx.baseline_summary(replica)
        n = base["n"] or 0
        if n < o.min_requests or num(base["ttft_p95"]) is None:
            why = (
                f"baseline has {n} requests (< {o.min_requests})"
                if n < o.min_requests
                else f"none of the baseline's {n} requests has a TTFT"
            )
            _note(ctx, replica, f"{why}; TTFT not compared")
            continue
        detect = rows[ctx.is_detect(rows)]
        limit = o.ttft_factor * float(base["ttft_p95"])
        flagged = detect[(detect["n"] >= o.min_bucket_requests) & (detect["ttft_p95"] >= limit)]
        span = episode(ctx, flagged)
        if span is None:
            if (detect["ttft_p95"] >= limit).any():  # a rise too thin to judge: say so
                _note(ctx, replica, f"TTFT p95 reached {o.ttft_factor:g}x the baseline only in "
                                    f"buckets of < {o.min_bucket_requests} requests")  # fmt: skip
            continue
        start, end = span
        ep = ctx.request_summary(replica, start, end)
        # An episode was flagged; every reason not to report it is said in the coverage.
        if (ep["n"] or 0) < o.min_requests:
            _note(ctx, replica, f"TTFT episode has {ep['n'] or 0} requests (< {o.min_requests})")
            continue
        ttft_ratio = ratio(ep["ttft_p95"], base["ttft_p95"])
        if ttft_ratio is None or ttft_ratio < o.ttft_factor:
            _note(ctx, replica, f"TTFT episode's p95 is {fmt_x(ttft_ratio)} the baseline's "
                                f"(< {o.ttft_factor:g}x)")  # fmt: skip
            continue
        if not significant(base, ep, o.min_z):
            _note(ctx, replica, f"TTFT episode's mean shift is under {o.min_z:g} standard errors")
            continue
        deltas = {
            k: max(0.0, (num(ep[f"{k}_mean"]) or 0.0) - (num(base[f"{k}_mean"]) or 0.0))
            for k in ("queue", "prefill", "frontend")
        }
        total = sum(deltas.values())
        shares = {k: (v / total if total > 0 else 0.0) for k, v in deltas.items()}
        inc = TtftIncrease(
            replica=replica,
            start=start,
            end=end,
            base=base,
            ep=ep,
            flagged_buckets=len(flagged),
            detect_buckets=int((detect["n"] > 0).sum()),
            ttft_ratio=ttft_ratio,
            tpot_ratio=ratio(ep["tpot_p50"], base["tpot_p50"]),
            shares=shares,
            kind=None,
        )
        _context_of(ctx, inc)
        timed = total > 0 and (ep["n_timed"] or 0) > 0
        inc.kind = _classify(ctx, inc, timed=timed)
        if inc.kind is None:
            why = (
                "no request of the episode has its TTFT split (queue/prefill/frontend)"
                if not timed
                else f"TPOT rose too ({fmt_x(inc.tpot_ratio)} > {o.tpot_flat_factor:g}x): "
                "not a queue, prefill or frontend pattern"
            )
            _note(ctx, replica, f"TTFT p95 {fmt_x(ttft_ratio)} the baseline, but {why}")
        out.append(inc)
    return out


def _context_of(ctx: DiagnoseContext, inc: TtftIncrease) -> None:
    eng = ctx.of("engine", inc.replica) if not ctx.engine.empty else None
    if eng is not None and not eng.empty:
        base = eng[ctx.is_baseline(eng)]
        ep = in_span(ctx, eng, inc.start, inc.end)
        inc.waiting_peak, inc.waiting_base_peak = _max(ep, "waiting_max"), _max(base, "waiting_max")
        inc.running_mean, inc.running_base_mean = (
            _mean(ep, "running_mean"),
            _mean(base, "running_mean"),
        )
        inc.running_peak = _max(ep, "running_mean")
    base_rate = (inc.base.get("n") or 0) / max(1e-9, ctx.base_until - ctx.base_since)
    inc.arrival_ratio = ratio((inc.ep.get("n") or 0) / max(1e-9, inc.end - inc.start), base_rate)
    gpu = ctx.of("gpu", inc.replica) if not ctx.gpu.empty else None
    if gpu is not None and not gpu.empty:
        inc.gpu_util = _mean(in_span(ctx, gpu, inc.start, inc.end), "util_mean")
        inc.gpu_util_base = _mean(gpu[ctx.is_baseline(gpu)], "util_mean")


def _classify(ctx: DiagnoseContext, inc: TtftIncrease, *, timed: bool) -> str | None:
    o = ctx.options
    if not timed:
        return None
    if inc.shares["frontend"] >= 0.5:
        return "frontend"
    gpu_idle = inc.gpu_util is not None and inc.gpu_util < o.idle_util_ratio
    # A batch that grew to take the queue says the engine is admitting work as fast as
    # its caps allow: the queue is the engine's, whatever the utilisation reads.
    batch_grew = (
        inc.running_mean is not None
        and inc.running_base_mean is not None
        and inc.running_mean >= o.batch_factor * max(inc.running_base_mean, 1.0)
    )
    if gpu_idle and not batch_grew and inc.shares["queue"] >= 0.5:
        return "frontend"
    if inc.tpot_ratio is not None and inc.tpot_ratio > o.tpot_flat_factor:
        return "queue" if _overloaded(ctx, inc) else None
    # Longer prompts make every step prefill-heavy: requests then also queue behind the
    # prefill chunks. The cause is the prefill work, even when queue time carries more.
    prompt_ratio = ratio(inc.ep.get("prompt_mean"), inc.base.get("prompt_mean"))
    if prompt_ratio is not None and prompt_ratio >= PROMPT_GROWTH and inc.shares["prefill"] >= 0.2:
        return "prefill"
    return "queue" if inc.shares["queue"] >= inc.shares["prefill"] else "prefill"


def _overloaded(ctx: DiagnoseContext, inc: TtftIncrease) -> bool:
    """TPOT rose, but the episode is a backlog: the batch filled and the rest waited."""
    o = ctx.options
    if inc.tpot_ratio is None or inc.shares["queue"] < 0.5:
        return False
    if inc.running_mean is None or inc.running_base_mean is None:
        return False
    # The batch at its fullest: a short burst's episode is a few buckets, the first of them
    # partly before the burst, so its mean understates the batch the burst filled (a burst
    # on two sequences: buckets of 1.1 and 1.8 from a baseline of 0).
    filled = max(inc.running_mean, inc.running_peak or 0.0)
    batch_ratio = filled / max(inc.running_base_mean, 1.0)
    burst = inc.arrival_ratio is not None and inc.arrival_ratio >= ARRIVAL_BURST
    if batch_ratio < o.batch_factor and not burst:
        return False  # every step slowed, batch and arrivals flat: not a backlog's doing
    if inc.waiting_peak is not None and inc.waiting_peak <= max(
        1.0, 2 * (inc.waiting_base_peak or 0)
    ):
        return False
    return inc.ttft_ratio >= o.ttft_factor * inc.tpot_ratio
