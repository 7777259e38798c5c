"""spec_decode_low_acceptance: speculative decoding's drafts are mostly rejected.

With ``k`` draft tokens per step and per-token acceptance ``a``, a verification step yields
``1 + accepted/drafts`` tokens while it pays for drafting ``k`` tokens and verifying ``k + 1``
positions. The rule fires when the acceptance rate (accepted / drafted tokens, from vLLM's
``spec_decode_*`` counters) falls ``spec_drop_ratio`` below its baseline, or when a step
yields fewer than ``spec_min_tokens_per_step`` tokens (below that the draft work rarely pays).
"""

from __future__ import annotations

from slokit.analysis.impact import assess, requests_in
from slokit.analysis.rules import NotApplicable, register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._util import (
    episode,
    fmt_pct,
    in_span,
    make_finding,
    on,
    ratio,
    rnd,
    rows_of,
    series,
)
from slokit.records import Finding, Severity


@register
class SpecDecodeLowAcceptance:
    id = "spec_decode_low_acceptance"
    needs = ("engine",)

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        o = ctx.options
        eng = ctx.engine
        if eng["spec_draft_tokens"].fillna(0).sum() <= 0:
            raise NotApplicable("no speculative decoding counters (spec decoding off)")
        eng = eng.assign(
            acceptance=eng["spec_accepted"]
            / eng["spec_draft_tokens"].where(eng["spec_draft_tokens"] > 0),
            tokens_per_step=1
            + eng["spec_accepted"] / eng["spec_drafts"].where(eng["spec_drafts"] > 0),
        )
        out = []
        for replica in sorted(eng["replica"].unique()):
            rows = rows_of(eng, replica)
            rows = rows[rows["spec_draft_tokens"].fillna(0) > 0]
            if rows.empty:
                continue
            base = rows[ctx.is_baseline(rows)]
            base_acc = ratio(base["spec_accepted"].sum(), base["spec_draft_tokens"].sum())
            limit_acc = (1 - o.spec_drop_ratio) * base_acc if base_acc is not None else None
            scope = rows[ctx.is_detect(rows)] if base_acc is not None else rows[ctx.in_window(rows)]
            low = scope["tokens_per_step"] < o.spec_min_tokens_per_step
            if limit_acc is not None:
                low = low | (scope["acceptance"] <= limit_acc)
            span = episode(ctx, scope[low])
            if span is None:
                continue
            ep = in_span(ctx, rows, *span)
            acc = ratio(ep["spec_accepted"].sum(), ep["spec_draft_tokens"].sum())
            tps = 1 + (ratio(ep["spec_accepted"].sum(), ep["spec_drafts"].sum()) or 0.0)
            k = ratio(ep["spec_draft_tokens"].sum(), ep["spec_drafts"].sum())
            if acc is None:
                continue
            dropped = limit_acc is not None and acc <= limit_acc
            uneconomic = tps < o.spec_min_tokens_per_step
            if not (dropped or uneconomic):
                continue
            summary = f"draft acceptance {fmt_pct(acc)}"
            if base_acc is not None:
                summary += f" vs {fmt_pct(base_acc)} baseline"
            summary += (
                f": {tps:.2f} tokens per verification step for {k or 0:.1f} drafted{on(replica)}"
            )
            if uneconomic:
                summary += "; drafting likely costs more than it saves"
            severity: Severity = "warning" if uneconomic else "info"
            confidence = 0.55 + (0.2 if dropped else 0.0) + (0.2 if uneconomic else 0.0)
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
                        "acceptance_rate": rnd(acc),
                        "acceptance_rate_baseline": rnd(base_acc),
                        "tokens_per_step": rnd(tps, 3),
                        "draft_tokens_per_step": rnd(k, 3),
                        "drafted_tokens": ep["spec_draft_tokens"].sum(),
                        "accepted_tokens": ep["spec_accepted"].sum(),
                        "acceptance_series": series(ctx, rows, "acceptance"),
                    },
                    # Every request decoded in the episode paid for the rejected drafts.
                    impact=assess(ctx, replica, requests_in(ctx, replica, *span)),
                    options=o,
                )
            )
        return out
