"""frontend_bound: requests wait, but not for the GPU.

TTFT rises while either the time outside the engine (tokenization, the API server, its
event loop) carries the increase, or requests queue while the GPU sits mostly idle (a
CPU-starved engine loop, scheduler overhead, tiny batches). Adding GPUs will not help.
"""

from __future__ import annotations

from slokit.analysis.rules import register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._latency import ttft_increases
from slokit.analysis.rules._util import fmt_pct, fmt_s, fmt_x, make_finding, num, on
from slokit.analysis.rules.queue_saturation import (
    confidence_of,
    latency_evidence,
    severity_of,
    ttft_impact,
)
from slokit.records import Finding


@register
class FrontendBound:
    id = "frontend_bound"
    needs = ("requests", "spans")

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        out = []
        for inc in ttft_increases(ctx):
            if inc.kind != "frontend":
                continue
            head = (
                f"TTFT p95 {fmt_s(num(inc.ep['ttft_p95']))} vs "
                f"{fmt_s(num(inc.base['ttft_p95']))} baseline ({fmt_x(inc.ttft_ratio)})"
            )
            if inc.shares["frontend"] >= 0.5:
                share = inc.shares["frontend"]
                summary = (
                    f"{head}; time outside the engine carries {fmt_pct(share)} of the "
                    f"increase (mean {fmt_s(num(inc.ep['frontend_mean']))} vs "
                    f"{fmt_s(num(inc.base['frontend_mean']))})"
                )
            else:
                share = inc.shares["queue"]
                summary = f"{head}; engine queue time carries {fmt_pct(share)} of the increase"
            idle = inc.gpu_util is not None and inc.gpu_util < ctx.options.idle_util_ratio
            if inc.gpu_util is not None:
                summary += f" while GPU utilisation averaged {fmt_pct(inc.gpu_util)}"
                if inc.gpu_util_base is not None:
                    summary += f" (baseline {fmt_pct(inc.gpu_util_base)})"
            if inc.running_mean is not None:
                summary += f", {inc.running_mean:.1f} requests running"
            summary += on(inc.replica)
            out.append(
                make_finding(
                    self.id,
                    severity=severity_of(ctx, inc, idle if inc.gpu_util is not None else None),
                    confidence=confidence_of(inc, share, idle),
                    replica=inc.replica,
                    start=inc.start,
                    end=inc.end,
                    summary=summary,
                    evidence=latency_evidence(inc),
                    impact=ttft_impact(ctx, inc),
                    options=ctx.options,
                )
            )
        return out
