"""kv_pressure: the KV pool is full and the scheduler preempts running requests.

vLLM keeps each running sequence's keys and values in fixed-size blocks (2 x layers x KV
heads x head dim x bytes per token). When a running request needs a block and none is free,
the newest running request is preempted: its blocks are freed and its whole context is
recomputed later. The rule needs both signals (a physical limit, no baseline): KV usage at
or above ``kv_full_ratio`` and the preemption counter rising in the same (or a neighbouring)
bucket.
"""

from __future__ import annotations

import pandas as pd

from slokit.analysis.impact import Impact, assess, slow_requests, window_requests
from slokit.analysis.rules import register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._util import (
    episode,
    fmt_pct,
    in_span,
    make_finding,
    num,
    on,
    rnd,
    series,
    whole,
)
from slokit.records import Finding, Severity
from slokit.sources.validate import MAX_COUNT


@register
class KvPressure:
    id = "kv_pressure"
    needs = ("engine",)

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        o = ctx.options
        out = []
        for replica in sorted(ctx.engine["replica"].unique()):
            eng = ctx.of("engine", replica)
            eng = eng[ctx.in_window(eng)]
            # A preemption frees blocks at once, so the sample after it may already read
            # below full: KV counts as full when it was in this bucket or a neighbour.
            kv_near = eng["kv_max"].rolling(3, center=True, min_periods=1).max()
            flagged = eng[(kv_near >= o.kv_full_ratio) & (eng["preemptions"] > 0)]
            span = episode(ctx, flagged)
            if span is None:
                continue
            start, end = span
            pre = ctx.reader.engine_counter_increase(
                "preemptions_total", replica, start - o.bucket_s, end
            )
            # The raw counter (a value past MAX_COUNT cannot be real: read it as unknown).
            increase = num(pre["increase"])
            if increase is not None and not 0 <= increase <= MAX_COUNT:
                increase = None
            preemptions = increase or num(flagged["preemptions"].sum()) or 0.0
            ep_eng = in_span(ctx, eng, start, end)
            kv_peak = num(ep_eng["kv_max"].max()) or 0.0
            kv_mean = num(ep_eng["kv_mean"].mean())
            completed = num(ep_eng["successes"].sum())
            per_request = (preemptions / completed) if completed else None
            summary = (
                f"KV cache {fmt_pct(kv_peak)} full (mean {fmt_pct(kv_mean)}) with "
                f"{preemptions:.0f} preemptions over {end - start:.0f} s{on(replica)}"
            )
            if per_request is not None:
                summary += f" ({per_request:.2f} per completed request)"
            evidence = {
                "kv_usage_peak": rnd(kv_peak),
                "kv_usage_mean": rnd(kv_mean),
                "preemptions": preemptions,
                "counter_resets": pre["resets"],
                "completed_requests": completed,
                "preemptions_per_request": rnd(per_request),
                "flagged_buckets": len(flagged),
                "kv_usage_series": series(ctx, eng, "kv_max"),
                "preemptions_series": series(ctx, eng, "preemptions"),
            }
            recompute = self._recompute(ctx, replica, start, end, preemptions)
            recompute = num(recompute)
            if recompute is not None:
                evidence["recompute_tokens_estimate"] = whole(recompute)
                summary += f"; ~{recompute:,.0f} tokens recomputed"
            if ctx.has("spans"):
                waits = ctx.request_summary(replica, start, end)
                evidence["tpot_p50"] = rnd(waits["tpot_p50"])
            baseline_pre = (
                num(
                    ctx.of("engine", replica).loc[lambda f: ctx.is_baseline(f), "preemptions"].sum()
                )
                or 0.0
            )
            evidence["baseline_preemptions"] = baseline_pre
            # Critical when the thrash is real: many preemptions, a tenth of requests hit.
            heavy = (per_request or 0) >= 0.1 and preemptions >= o.error_min_count
            severity: Severity = "critical" if heavy else "warning"
            confidence = 0.6 + 0.15 * min(1.0, len(flagged) / 3) + (0.15 if kv_peak >= 0.99 else 0)
            out.append(
                make_finding(
                    self.id,
                    severity=severity,
                    confidence=confidence,
                    replica=replica,
                    start=start,
                    end=end,
                    summary=summary,
                    evidence=evidence,
                    impact=self._impact(ctx, replica, eng[kv_near >= o.kv_full_ratio], preemptions),
                    options=o,
                )
            )
        return out

    @staticmethod
    def _impact(
        ctx: DiagnoseContext, replica: str, full: pd.DataFrame, preemptions: float
    ) -> Impact | None:
        """Requests the full pool set back: each preemption one, plus the requests that
        waited for blocks (slow first tokens in the buckets where the pool was full)."""
        if not ctx.has("requests"):
            return None
        base_p95 = num(ctx.baseline_summary(replica)["ttft_p95"])
        waited = 0
        if base_p95 is not None:
            limit = ctx.options.ttft_factor * base_p95
            for bucket in full["bucket"]:
                b0 = ctx.bucket_start(int(bucket))
                waited += slow_requests(
                    ctx, replica, b0, b0 + ctx.options.bucket_s, column="ttft_p95", limit=limit
                )
        return assess(ctx, replica, min(preemptions + waited, window_requests(ctx, replica)))

    @staticmethod
    def _recompute(
        ctx: DiagnoseContext, replica: str, start: float, end: float, preemptions: float
    ) -> float | None:
        """Tokens recomputed: each preemption discards a context of roughly the prompt plus
        half the output (it is preempted mid-decode on average)."""
        if not ctx.has("requests"):
            return None
        s = ctx.request_summary(replica, start, end)
        prompt, output = num(s["prompt_mean"]), num(s["output_mean"])
        if prompt is None:
            return None
        return preemptions * (prompt + 0.5 * (output or 0.0))
