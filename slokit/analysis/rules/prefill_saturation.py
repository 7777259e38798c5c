"""prefill_saturation: TTFT up while TPOT is flat, and prefill time carries the increase.

Prefill is compute-bound (about 2 x parameters x prompt tokens FLOPs): long prompts, or a
small per-step token budget that chunks them, make the first token late. Confirmed by the
prompt length and prefill time against their baselines.
"""

from __future__ import annotations

from slokit.analysis.rules import register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._latency import ttft_increases
from slokit.analysis.rules._util import fmt_pct, fmt_s, fmt_x, make_finding, num, on, ratio
from slokit.analysis.rules.queue_saturation import (
    confidence_of,
    latency_evidence,
    severity_of,
    ttft_headline,
    ttft_impact,
)
from slokit.records import Finding


@register
class PrefillSaturation:
    id = "prefill_saturation"
    needs = ("requests", "spans")

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        out = []
        for inc in ttft_increases(ctx):
            if inc.kind != "prefill":
                continue
            share = inc.shares["prefill"]
            prefill_ratio = ratio(inc.ep["prefill_mean"], inc.base["prefill_mean"])
            prompt_ratio = ratio(inc.ep["prompt_mean"], inc.base["prompt_mean"])
            summary = (
                f"{ttft_headline(inc, ctx.options.tpot_flat_factor)}; prefill time carries {fmt_pct(share)} of the "
                f"increase (mean prefill {fmt_s(num(inc.ep['prefill_mean']))} vs "
                f"{fmt_s(num(inc.base['prefill_mean']))}, {fmt_x(prefill_ratio)})"
            )
            if inc.shares["queue"] >= 0.2:
                summary += f"; queueing behind prefills carries {fmt_pct(inc.shares['queue'])}"
            if prompt_ratio is not None:
                summary += (
                    f"; prompts average {num(inc.ep['prompt_mean']) or 0:.0f} tokens vs "
                    f"{num(inc.base['prompt_mean']) or 0:.0f} ({fmt_x(prompt_ratio)})"
                )
            summary += on(inc.replica)
            confirmed = (prompt_ratio or 0) >= 1.5 or (prefill_ratio or 0) >= 2
            evidence = latency_evidence(inc)
            evidence["prefill_mean_ratio"] = prefill_ratio
            evidence["prompt_mean_ratio"] = prompt_ratio
            out.append(
                make_finding(
                    self.id,
                    severity=severity_of(ctx, inc, confirmed),
                    confidence=confidence_of(inc, share, confirmed),
                    replica=inc.replica,
                    start=inc.start,
                    end=inc.end,
                    summary=summary,
                    evidence=evidence,
                    impact=ttft_impact(ctx, inc),
                    options=ctx.options,
                )
            )
        return out
