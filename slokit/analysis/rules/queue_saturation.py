"""queue_saturation: TTFT up while TPOT is flat, and engine queue time carries the increase.

More requests want to run than the engine admits (``--max-num-seqs``, the token budget or the
KV pool cap the running batch), so new requests wait in vLLM's waiting queue. Confirmed by
the waiting-queue peak against its baseline.
"""

from __future__ import annotations

from slokit.analysis.impact import Impact, assess, slow_requests
from slokit.analysis.rules import register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._latency import ARRIVAL_BURST, TtftIncrease, ttft_increases
from slokit.analysis.rules._util import (
    fmt_pct,
    fmt_s,
    fmt_x,
    in_span,
    make_finding,
    num,
    on,
    rnd,
)
from slokit.records import Finding, Severity


def latency_evidence(inc: TtftIncrease) -> dict[str, object]:
    """The numbers behind a TTFT finding, shared by the TTFT rules."""
    keys = (
        "n",
        "ttft_p95",
        "tpot_p50",
        "queue_mean",
        "prefill_mean",
        "frontend_mean",
        "prompt_mean",
    )
    return {
        "baseline": {k: rnd(inc.base.get(k)) for k in keys},
        "episode": {k: rnd(inc.ep.get(k)) for k in keys},
        "ttft_p95_ratio": rnd(inc.ttft_ratio, 3),
        "tpot_p50_ratio": rnd(inc.tpot_ratio, 3),
        "increase_share": {k: rnd(v, 3) for k, v in inc.shares.items()},
        "waiting_peak": inc.waiting_peak,
        "waiting_baseline_peak": inc.waiting_base_peak,
        "running_mean": rnd(inc.running_mean, 2),
        "running_peak": rnd(inc.running_peak, 2),
        "arrival_ratio": rnd(inc.arrival_ratio, 3),
        "running_baseline_mean": rnd(inc.running_base_mean, 2),
        "gpu_util_mean": rnd(inc.gpu_util, 3),
        "gpu_util_baseline_mean": rnd(inc.gpu_util_base, 3),
        "flagged_buckets": inc.flagged_buckets,
        "detect_buckets": inc.detect_buckets,
    }


#: vLLM's ``num_requests_waiting_by_reason`` reasons, as engine_buckets peaks them.
WAITING_REASONS = ("capacity", "deferred")


def waiting_by_reason(ctx: DiagnoseContext, inc: TtftIncrease) -> dict[str, float] | None:
    """The episode's waiting-queue peak per vLLM reason (``capacity``: no room to schedule;
    ``deferred``: held back by LoRA budget or a KV transfer), or None when not exposed."""
    if ctx.engine.empty:
        return None
    ep = in_span(ctx, ctx.of("engine", inc.replica), inc.start, inc.end)
    out: dict[str, float] = {}
    for reason in WAITING_REASONS:
        col = f"waiting_{reason}_max"
        if col in ep.columns and ep[col].notna().any():
            out[reason] = float(ep[col].max())
    return out or None


def queue_evidence(ctx: DiagnoseContext, inc: TtftIncrease) -> dict[str, object]:
    """:func:`latency_evidence`, and the waiting peak by reason when vLLM exposes it (e.g.
    ``{"capacity": 200, "deferred": 59}``)."""
    evidence = latency_evidence(inc)
    by_reason = waiting_by_reason(ctx, inc)
    if by_reason is not None:
        evidence["waiting_by_reason_peak"] = {k: rnd(v, 2) for k, v in by_reason.items()}
    return evidence


def ttft_headline(inc: TtftIncrease, flat_factor: float = 1.3) -> str:
    if inc.tpot_ratio is None:
        tpot = "TPOT unknown"
    elif inc.tpot_ratio <= flat_factor:
        tpot = f"TPOT flat ({fmt_x(inc.tpot_ratio)})"
    else:  # a backlog that filled the batch: each step slowed as the batch grew
        filled = max(inc.running_mean or 0.0, inc.running_peak or 0.0)
        batch = (
            f" as the running batch grew {inc.running_base_mean:.1f} -> {filled:.1f}"
            if inc.running_mean is not None and inc.running_base_mean is not None
            else ""
        )
        if inc.arrival_ratio is not None and inc.arrival_ratio >= ARRIVAL_BURST:
            batch += f"{' and' if batch else ' as'} arrivals rose {fmt_x(inc.arrival_ratio)}"
        tpot = f"TPOT rose only {fmt_x(inc.tpot_ratio)}{batch}"
    return (
        f"TTFT p95 {fmt_s(num(inc.ep['ttft_p95']))} vs {fmt_s(num(inc.base['ttft_p95']))} "
        f"baseline ({fmt_x(inc.ttft_ratio)}) while {tpot}"
    )


def severity_of(ctx: DiagnoseContext, inc: TtftIncrease, confirmed: bool | None = None) -> Severity:
    """By the size of the TTFT increase; one level lower when a confirming signal that
    could have been seen (``confirmed=False``) was not."""
    o = ctx.options
    levels: list[Severity] = ["info", "warning", "critical"]
    level = (
        2 if inc.ttft_ratio >= o.critical_factor else 1 if inc.ttft_ratio >= o.warning_factor else 0
    )
    if confirmed is False:
        level = max(0, level - 1)
    return levels[level]


def ttft_impact(ctx: DiagnoseContext, inc: TtftIncrease) -> Impact | None:
    """The episode's slow requests: those of its buckets whose TTFT p95 reached
    ``ttft_factor`` times the baseline's (and its failed requests)."""
    limit = ctx.options.ttft_factor * (num(inc.base["ttft_p95"]) or 0.0)
    affected = slow_requests(ctx, inc.replica, inc.start, inc.end, column="ttft_p95", limit=limit)
    return assess(ctx, inc.replica, affected)


def confidence_of(inc: TtftIncrease, share: float, confirmed: bool) -> float:
    return (
        0.35
        + 0.25 * share
        + 0.15 * min(1.0, inc.flagged_share * 2)
        + (0.15 if confirmed else 0.0)
        + 0.1 * min(1.0, (inc.ep["n"] or 0) / 200)
    )


@register
class QueueSaturation:
    id = "queue_saturation"
    needs = ("requests", "spans")

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        out = []
        for inc in ttft_increases(ctx):
            if inc.kind != "queue":
                continue
            share = inc.shares["queue"]
            summary = f"{ttft_headline(inc, ctx.options.tpot_flat_factor)}; queue time carries {fmt_pct(share)} of the increase"
            confirmed: bool | None = None
            if inc.waiting_peak is not None:
                summary += f"; waiting peaked at {inc.waiting_peak:.0f}{on(inc.replica)}"
                base_peak = inc.waiting_base_peak or 0.0
                confirmed = inc.waiting_peak > max(1.0, 2 * base_peak)
                if base_peak:
                    summary += f" (baseline peak {base_peak:.0f})"
            else:
                summary += on(inc.replica)
            out.append(
                make_finding(
                    self.id,
                    severity=severity_of(ctx, inc, confirmed),
                    confidence=confidence_of(inc, share, bool(confirmed)),
                    replica=inc.replica,
                    start=inc.start,
                    end=inc.end,
                    summary=summary,
                    evidence=queue_evidence(ctx, inc),
                    impact=ttft_impact(ctx, inc),
                    options=ctx.options,
                )
            )
        return out
