"""beyond_knee: offered load is past the fleet's capacity; throughput is flat and the
queue (and with it the tail) grows without bound.

Below the knee of the throughput-latency curve, continuous batching absorbs more load by
running bigger batches: throughput follows arrivals. Past it, throughput stays at the
capacity and every extra request only lengthens the queue. Over the detection period (after
the baseline, up to the last arrival), split in thirds, the rule requires in the last
third: arrivals above completions by ``knee_backlog_ratio`` of the arrivals and by more
than 3 sigma of their Poisson noise (the backlog grows), completions that did not keep up
with the growth of arrivals, and a TTFT p99 ``ttft_factor`` times the baseline's.
Fleet-wide: a replica that is past its knee alone is a routing problem, seen as
queue_saturation on it.
"""

from __future__ import annotations

import pandas as pd

from slokit.analysis.impact import assess, slow_requests
from slokit.analysis.rules import register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._util import fmt_s, fmt_x, make_finding, num, ratio, rnd, series
from slokit.records import Finding, Severity

MIN_BUCKETS = 6


@register
class BeyondKnee:
    id = "beyond_knee"
    needs = ("requests",)

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        o = ctx.options
        arr = ctx.requests.groupby("bucket")["n"].sum()
        done = ctx.finished.groupby("bucket")["completed"].sum() if not ctx.finished.empty else None
        first = int((ctx.detect_since - ctx.origin) // o.bucket_s)
        last = int((ctx.until - ctx.origin) // o.bucket_s)
        if ctx.until - ctx.bucket_start(last) < 0.5 * o.bucket_s:
            last -= 1  # a sliver of a bucket at the end says nothing about rates
        if not arr.empty:
            # After the last arrival the queue only drains (the load test ended): judge the
            # span in which load was offered.
            last = min(last, int(arr[arr > 0].index.max()) - 1)
        if last - first + 1 < MIN_BUCKETS:
            ctx.note(
                self.id,
                f"detection period has {max(0, last - first + 1)} buckets "
                f"(< {MIN_BUCKETS}); trend not judged",
            )
            return []
        idx = pd.RangeIndex(first, last + 1)
        frame = pd.DataFrame(
            {
                "bucket": idx,
                "arrivals": arr.reindex(idx, fill_value=0).to_numpy(dtype=float),
                "completed": (
                    done.reindex(idx, fill_value=0).to_numpy(dtype=float)
                    if done is not None
                    else 0.0
                ),
            }
        )
        frame["backlog"] = (frame["arrivals"] - frame["completed"]).cumsum()
        third = max(2, len(frame) // 3)
        head, tail = frame.iloc[:third], frame.iloc[-third:]
        a1, a3 = head["arrivals"].sum(), tail["arrivals"].sum()
        c1, c3 = head["completed"].sum(), tail["completed"].sum()
        if a1 <= 0 or c1 <= 0 or a3 <= 0:
            return []
        arrival_growth, throughput_growth = a3 / a1, c3 / c1
        # The backlog must grow over the last third by more than arrival noise (Poisson:
        # 3 sigma of the arrival count) and by a share of what arrived.
        growth = a3 - c3
        overloaded = growth >= max(o.knee_backlog_ratio * a3, 3 * a3**0.5)
        flat = throughput_growth <= 1 + 0.5 * max(0.0, arrival_growth - 1)
        if not (overloaded and flat):
            return []
        base = ctx.request_summary(None, ctx.base_since, ctx.base_until)
        late = ctx.request_summary(
            None, ctx.bucket_start(int(tail["bucket"].iloc[0])), ctx.until + 1e-6
        )
        p99_ratio = ratio(late["ttft_p99"], base["ttft_p99"])
        if (base["n"] or 0) < o.min_requests or p99_ratio is None or p99_ratio < o.ttft_factor:
            return []
        span_s = third * o.bucket_s
        capacity = num(frame["completed"].max()) or 0.0
        # The backlog's last low point is where the queue started to grow for good.
        low = frame["backlog"].min()
        calm = frame[frame["backlog"] <= low + 0.02 * (frame["backlog"].max() - low) + 1]
        start_bucket = int(calm["bucket"].iloc[-1])
        summary = (
            f"arrivals {a1 / span_s:.1f} -> {a3 / span_s:.1f} req/s "
            f"({fmt_x(arrival_growth)}) while completions went {c1 / span_s:.1f} -> "
            f"{c3 / span_s:.1f} req/s ({fmt_x(throughput_growth)}), peaking at "
            f"{capacity / o.bucket_s:.1f} req/s; backlog {frame['backlog'].iloc[-1]:.0f} "
            f"requests and growing; TTFT p99 {fmt_s(num(late['ttft_p99']))} vs "
            f"{fmt_s(num(base['ttft_p99']))} baseline ({fmt_x(p99_ratio)})"
        )
        evidence: dict[str, object] = {
            "arrival_rate_first": rnd(a1 / span_s, 3),
            "arrival_rate_last": rnd(a3 / span_s, 3),
            "completion_rate_first": rnd(c1 / span_s, 3),
            "completion_rate_last": rnd(c3 / span_s, 3),
            "capacity_req_s": rnd(capacity / o.bucket_s, 3),
            "backlog_end": float(frame["backlog"].iloc[-1]),
            "backlog_growth_last_third": float(growth),
            "ttft_p99": rnd(late["ttft_p99"]),
            "ttft_p99_baseline": rnd(base["ttft_p99"]),
            "arrivals_series": series(ctx, frame, "arrivals"),
            "completed_series": series(ctx, frame, "completed"),
            "backlog_series": series(ctx, frame, "backlog"),
        }
        confirm = 0.0
        if not ctx.engine.empty:
            waits = ctx.engine.groupby("bucket")["waiting_mean"].sum().reindex(idx)
            w1, w3 = num(waits.iloc[:third].mean()), num(waits.iloc[-third:].mean())
            if w1 is not None and w3 is not None:
                evidence["waiting_first"], evidence["waiting_last"] = rnd(w1, 2), rnd(w3, 2)
                summary += f"; waiting {w1:.0f} -> {w3:.0f}"
                confirm = 0.15 if w3 > max(2 * w1, 1.0) else 0.0
        confidence = 0.5 + confirm + 0.15 * min(1.0, (arrival_growth - 1) / 0.5) + 0.1
        severity: Severity = "critical" if p99_ratio >= o.critical_factor else "warning"
        # Affected: requests of the fleet's buckets past the knee whose TTFT p95 reached
        # ``ttft_factor`` times the baseline's.
        slow = slow_requests(
            ctx,
            None,
            ctx.bucket_start(start_bucket),
            ctx.until + 1e-6,
            column="ttft_p95",
            limit=o.ttft_factor * (num(base["ttft_p95"]) or 0.0),
        )
        return [
            make_finding(
                self.id,
                severity=severity,
                confidence=confidence,
                replica=None,
                start=ctx.bucket_start(start_bucket),
                end=ctx.until,
                summary=summary,
                evidence=evidence,
                impact=assess(ctx, None, slow),
                options=o,
            )
        ]
