"""gpu_throttle: the SM clock falls below its own baseline while the GPU is busy.

A throttled GPU (power cap, thermal slowdown, a clock policy) runs every kernel slower:
prefill, which is compute-bound, slows in proportion to the clock; decode less. Idle GPUs
lower their clocks on purpose, so clocks are only compared over samples where utilisation is
at least ``busy_util_ratio``. The baseline is the replica's busy clock during the baseline
period (or, lacking one, its own 95th percentile busy clock over the window).
"""

from __future__ import annotations

from slokit.analysis.impact import assess, requests_in
from slokit.analysis.rules import register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._util import (
    episode,
    fmt_pct,
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


@register
class GpuThrottle:
    id = "gpu_throttle"
    needs = ("gpu",)

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        o = ctx.options
        out = []
        for replica in sorted(ctx.gpu["replica"].unique()):
            rows = ctx.of("gpu", replica)
            busy = rows.dropna(subset=["clock_busy"])
            if busy.empty:
                continue
            base_rows = busy[ctx.is_baseline(busy)]
            if not base_rows.empty:
                base_clock, base_from = num(base_rows["clock_busy"].median()), "baseline"
            else:
                base_clock, base_from = num(busy["clock_busy"].quantile(0.95)), "own p95"
            if not base_clock:
                continue
            detect = busy[ctx.is_detect(busy)]
            flagged = detect[detect["clock_busy"] <= o.clock_drop_ratio * base_clock]
            span = episode(ctx, flagged)
            if span is None:
                continue
            ep = in_span(ctx, busy, *span)
            clock = num(ep["clock_busy"].median()) or 0.0
            clock_ratio = clock / base_clock
            summary = (
                f"SM clock {clock:.0f} MHz while busy vs {base_clock:.0f} MHz "
                f"{base_from} ({fmt_pct(clock_ratio)}){on(replica)}"
            )
            evidence: dict[str, object] = {
                "sm_clock_busy_mhz": rnd(clock),
                "sm_clock_baseline_mhz": rnd(base_clock),
                "baseline_from": base_from,
                "clock_ratio": rnd(clock_ratio, 3),
                "util_mean": rnd(ep["util_mean"].mean(), 3),
                "flagged_buckets": len(flagged),
                "sm_clock_series": series(ctx, busy, "clock_busy"),
            }
            confirm = 0
            temp, temp_base = num(ep["temp_max"].max()), num(base_rows["temp_max"].max())
            if temp is not None:
                evidence["temperature_max_c"] = temp
                evidence["temperature_baseline_max_c"] = temp_base
                summary += f"; temperature peaked at {temp:.0f} C"
                if temp_base is not None and temp >= temp_base + 5:
                    confirm += 1
            power, power_base = num(ep["power_mean"].mean()), num(base_rows["power_mean"].mean())
            if power is not None:
                evidence["power_mean_w"] = rnd(power, 1)
                evidence["power_baseline_mean_w"] = rnd(power_base, 1)
                summary += f", power {power:.0f} W"
                if power_base:
                    summary += f" vs {power_base:.0f} W"
            if ctx.has("requests"):
                base = ctx.baseline_summary(replica)
                ep_req = ctx.request_summary(replica, *span)
                tpot_ratio = ratio(ep_req["tpot_p50"], base["tpot_p50"])
                if tpot_ratio is not None:
                    evidence["tpot_p50_ratio"] = rnd(tpot_ratio, 3)
                    summary += f"; TPOT p50 {fmt_x(tpot_ratio)} baseline"
                    if tpot_ratio >= 1.1:
                        confirm += 1
            severity: Severity = "critical" if clock_ratio <= 0.6 else "warning"
            confidence = (
                0.55
                + 0.1 * min(1.0, len(flagged) / 3)
                + 0.1 * confirm
                + (0.1 if base_from == "baseline" else 0.0)
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
                    evidence=evidence,
                    # Every request served while throttled ran on slower kernels.
                    impact=assess(ctx, replica, requests_in(ctx, replica, *span)),
                    options=o,
                )
            )
        return out
