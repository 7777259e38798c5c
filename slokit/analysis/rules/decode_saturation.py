"""decode_saturation: TPOT rises with the running batch.

Decode is memory-bandwidth-bound: every step reads the weights once plus the KV cache of
every running sequence, so a larger running batch makes each step (and each output token)
slower. The rule fires when, after the baseline, TPOT p50 is ``tpot_factor`` times the
baseline while the running batch is ``batch_factor`` times its baseline, and (with enough
buckets, baseline included) TPOT and batch size move together (rank correlation). The
batch must have grown because more requests arrived (Little's law: with flat arrivals a
slowdown grows the batch, not the reverse), and not with prompts as much longer (prefill
chunks in the decode steps then explain both); otherwise the rule stays quiet and says why
in the coverage notes.
"""

from __future__ import annotations

import pandas as pd

from slokit.analysis.impact import assess, slow_requests
from slokit.analysis.rules import register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._util import (
    episode,
    fmt_s,
    fmt_x,
    in_span,
    make_finding,
    num,
    on,
    ratio,
    rnd,
    series,
)
from slokit.records import Finding, Severity

MIN_CORR_BUCKETS = 4
MIN_CORR = 0.5
#: Arrivals must have grown by this share of the batch growth for the batch to be the cause.
ARRIVAL_SHARE = 0.3


def rank_corr(a: pd.Series, b: pd.Series) -> float | None:
    """Spearman rank correlation (no SciPy): Pearson on ranks; None when undefined."""
    if len(a) < MIN_CORR_BUCKETS:
        return None
    v = a.rank().corr(b.rank())
    return num(v)


@register
class DecodeSaturation:
    id = "decode_saturation"
    needs = ("requests", "engine")

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        o = ctx.options
        out = []
        for replica in sorted(set(ctx.requests["replica"]) & set(ctx.engine["replica"])):
            req, eng = ctx.of("requests", replica), ctx.of("engine", replica)
            base = ctx.baseline_summary(replica)
            base_tpot = num(base["tpot_p50"])
            base_running = num(eng[ctx.is_baseline(eng)]["running_mean"].mean())
            if (base["n"] or 0) < o.min_requests or base_tpot is None or base_running is None:
                ctx.note(self.id, f"{replica or 'fleet'}: no baseline TPOT or batch size")
                continue
            merged = req[["bucket", "n", "tpot_p50"]].merge(
                eng[["bucket", "running_mean", "running_max"]], on="bucket"
            )
            detect = merged[ctx.is_detect(merged)]
            flagged = detect[
                (detect["n"] >= o.min_bucket_requests)
                & (detect["tpot_p50"] >= o.tpot_factor * base_tpot)
                & (detect["running_mean"] >= o.batch_factor * max(base_running, 1.0))
            ]
            span = episode(ctx, flagged)
            if span is None:
                continue
            ep = ctx.request_summary(replica, *span)
            tpot_ratio = ratio(ep["tpot_p50"], base_tpot)
            running_ep = num(in_span(ctx, eng, *span)["running_mean"].mean())
            batch_ratio = ratio(running_ep, max(base_running, 1.0))
            if (ep["n"] or 0) < o.min_requests or tpot_ratio is None or batch_ratio is None:
                continue
            if tpot_ratio < o.tpot_factor or batch_ratio < o.batch_factor:
                continue
            prompt_ratio = ratio(ep["prompt_mean"], base["prompt_mean"])
            if prompt_ratio is not None and prompt_ratio >= o.batch_factor:
                # Longer prompts put compute-heavy prefill chunks into the decode steps: the
                # steps slow down and requests stay longer (so the batch grows) -- the
                # cause is the prompts, which the TTFT rules judge.
                ctx.note(
                    self.id,
                    f"{replica or 'fleet'}: TPOT {tpot_ratio:.1f}x with prompts "
                    f"{prompt_ratio:.1f}x longer; prefill interference, not batch size",
                )
                continue
            base_rate = (base["n"] or 0) / max(1e-9, ctx.base_until - ctx.base_since)
            arrival_ratio = ratio((ep["n"] or 0) / max(1e-9, span[1] - span[0]), base_rate)
            if arrival_ratio is None or arrival_ratio < 1 + ARRIVAL_SHARE * (batch_ratio - 1):
                # Little's law: batch = arrival rate x time in system. A batch that grew with
                # flat arrivals grew *because* each request got slower (throttling, lower
                # speculative acceptance, preemption...): the slowdown is not the batch's.
                ctx.note(
                    self.id,
                    f"{replica or 'fleet'}: TPOT {tpot_ratio:.1f}x and batch {batch_ratio:.1f}x "
                    f"with arrivals {arrival_ratio or 0:.1f}x; the batch grew because requests "
                    "slowed, not the reverse",
                )
                continue
            # Baseline and window together: the correlation needs the range of batch sizes
            # (within a saturated plateau both only wobble), so the quiet buckets count too.
            window = merged[merged["n"] >= o.min_bucket_requests]
            corr = rank_corr(window["tpot_p50"], window["running_mean"])
            if corr is not None and corr < MIN_CORR:
                continue
            summary = (
                f"TPOT p50 {fmt_s(num(ep['tpot_p50']))} vs {fmt_s(base_tpot)} baseline "
                f"({fmt_x(tpot_ratio)}) as the running batch grew {base_running:.0f} -> "
                f"{running_ep:.0f} ({fmt_x(batch_ratio)}){on(replica)}"
            )
            if corr is not None:
                summary += f"; TPOT follows batch size (rank corr {corr:.2f})"
            severity: Severity = "critical" if tpot_ratio >= o.critical_factor else "warning"
            confidence = (
                0.45
                + 0.2 * min(1.0, (corr or 0.5))
                + 0.15 * min(1.0, len(flagged) / 3)
                + 0.1 * min(1.0, (ep["n"] or 0) / 200)
            )
            # Affected: requests of the episode's buckets whose TPOT p50 reached the limit.
            slow = slow_requests(
                ctx, replica, *span, column="tpot_p50", limit=o.tpot_factor * base_tpot
            )
            out.append(
                make_finding(
                    self.id,
                    severity=severity,
                    confidence=confidence,
                    replica=replica,
                    start=span[0],
                    end=span[1],
                    summary=summary,
                    evidence={
                        "tpot_p50_baseline": rnd(base_tpot),
                        "tpot_p50": rnd(ep["tpot_p50"]),
                        "tpot_p95": rnd(ep["tpot_p95"]),
                        "tpot_ratio": rnd(tpot_ratio, 3),
                        "running_baseline_mean": rnd(base_running, 2),
                        "running_mean": rnd(running_ep, 2),
                        "batch_ratio": rnd(batch_ratio, 3),
                        "rank_corr_tpot_running": rnd(corr, 3),
                        "arrival_ratio": rnd(arrival_ratio, 3),
                        "tpot_p50_series": series(ctx, window, "tpot_p50"),
                        "running_mean_series": series(ctx, window, "running_mean"),
                    },
                    impact=assess(ctx, replica, slow),
                    options=o,
                )
            )
        return out
