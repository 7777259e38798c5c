"""error_burst: the share of failed requests jumps above its baseline.

Failed means status error, timeout or rejected (cancelled is the client's choice). A burst
needs at least ``error_min_count`` failures, a share at least ``error_factor`` times the
baseline share and at least ``error_min_ratio`` (below that it is noise, whatever its growth).
"""

from __future__ import annotations

import pandas as pd

from slokit.analysis.impact import assess
from slokit.analysis.rules import register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._util import (
    episode,
    fmt_pct,
    make_finding,
    num,
    on,
    ratio,
    rnd,
    series,
)
from slokit.records import Finding, Severity


@register
class ErrorBurst:
    id = "error_burst"
    needs = ("requests",)

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        o = ctx.options
        out = []
        reqs = ctx.requests
        groups: list[tuple[str | None, pd.DataFrame]] = [
            (str(r), ctx.of("requests", str(r))) for r in sorted(reqs["replica"].unique()) if r
        ]
        if (reqs["replica"] == "").any():
            # Requests without a replica (failed before any engine saw them, client-only
            # records): judge the fleet as a whole, where they belong.
            fleet = reqs.groupby("bucket", as_index=False)[["n", "n_err"]].sum()
            groups.insert(0, (None, fleet))
        for replica, rows in groups:
            base = ctx.baseline_summary(replica)
            base_rate = ratio(base["n_err"], base["n"])
            if base_rate is None or (base["n"] or 0) < o.min_requests:
                ctx.note(
                    self.id,
                    f"{replica or 'fleet'}: baseline has {base['n']} requests; "
                    "errors judged against zero",
                )
                base_rate = 0.0
            limit = max(o.error_factor * base_rate, o.error_min_ratio)
            detect = rows[ctx.is_detect(rows)].assign(rate=lambda f: f["n_err"] / f["n"])
            # A bucket counts when its errors are both a large share and improbable under
            # the baseline ratio (Poisson: 3 sigma above the expected count, and at least 2).
            expected = detect["n"] * base_rate
            improbable = detect["n_err"] >= (expected + 3 * expected.clip(lower=1) ** 0.5).clip(
                lower=2
            )
            flagged = detect[improbable & (detect["rate"] >= limit)]
            span = episode(ctx, flagged)
            if span is None:
                continue
            ep = ctx.request_summary(replica, *span)
            rate = ratio(ep["n_err"], ep["n"])
            if rate is None or ep["n_err"] < o.error_min_count or rate < limit:
                continue
            summary = (
                f"{fmt_pct(rate, 1)} of requests failed ({ep['n_err']}/{ep['n']}) vs "
                f"{fmt_pct(base_rate, 1)} baseline{on(replica)}"
            )
            if ep["top_error"] or ep["top_http_status"]:
                status = ep["top_http_status"]
                http = f" (HTTP {status})" if status else ""
                summary += f"; most often {ep['top_error'] or 'error'}{http}"
            severity: Severity = "critical" if rate >= 0.1 else "warning"
            confidence = 0.6 + 0.2 * min(1.0, ep["n_err"] / 50) + 0.15 * min(1.0, len(flagged) / 3)
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
                        "error_ratio": rnd(rate),
                        "errors": int(ep["n_err"]),
                        "requests": int(ep["n"]),
                        "baseline_error_ratio": rnd(base_rate),
                        "baseline_requests": base["n"],
                        "top_error_type": ep["top_error"],
                        "top_http_status": num(ep["top_http_status"]),
                        "error_ratio_series": series(ctx, detect, "rate"),
                    },
                    impact=assess(ctx, replica, ep["n_err"]),
                    options=o,
                )
            )
        return out
