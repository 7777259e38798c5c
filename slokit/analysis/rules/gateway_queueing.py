"""gateway_queueing: the gateway router and the engines disagree about saturation.

The router (llm-d router / Gateway API Inference Extension endpoint picker) holds requests in
its flow-control queue, or reports its pool saturated, while the engines behind it have
headroom (little waiting, KV below full): its saturation detection or capacity limits are
set too tight and requests wait at the gateway for capacity that exists. Or the reverse: the
engines are saturated (requests pile up in vLLM's waiting queue or KV is full) while the
router, with flow control on, admits everything: its saturation detection does not see the
engines' state (thresholds too high, stale metrics), so queueing moves into the engines where
it cannot be prioritised or shed. Evidence from both sides, per bucket of the window.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from slokit.analysis.impact import assess, requests_in
from slokit.analysis.rules import NotApplicable, register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._util import episode, fmt_pct, make_finding, num, rnd, series
from slokit.records import Finding, Severity

#: A router queue of at least this many requests (mean over a bucket) is queueing.
MIN_ROUTER_QUEUE = 1.0
#: Flow control's gating set point (llm-d router docs/metrics.md): saturation at or above
#: it stops dispatch.
SATURATED = 1.0
#: Engines with at most this many waiting requests per replica (bucket mean) have headroom.
HEADROOM_WAITING = 0.5
#: Engines with at least this many waiting requests per replica (bucket mean) are saturated.
SATURATED_WAITING = 2.0
#: Flagged buckets needed for a finding, and their share of the buckets with router data.
MIN_BUCKETS = 2
MIN_SHARE = 0.2


@dataclass
class _Episode:
    kind: str  # "router_holds_back" | "router_admits_all"
    flagged: pd.DataFrame
    both: pd.DataFrame
    start: float
    end: float


def _fleet_engine(ctx: DiagnoseContext) -> pd.DataFrame:
    """Engines per bucket over the fleet: waiting per replica, KV peak, running."""
    e = ctx.engine[ctx.in_window(ctx.engine)]
    return e.groupby("bucket").agg(
        replicas=("replica", "nunique"),
        waiting=("waiting_mean", "sum"),
        waiting_peak=("waiting_max", "sum"),
        kv_max=("kv_max", "max"),
        running=("running_mean", "sum"),
    )


def _fleet_router(ctx: DiagnoseContext) -> pd.DataFrame:
    r = ctx.router[ctx.in_window(ctx.router)]
    return r.groupby("bucket").agg(
        queue=("queue_mean", "sum"),
        queue_peak=("queue_max", "sum"),
        saturation=("saturation_max", "max"),
        pool_kv=("pool_kv_mean", "mean"),
        pool_queue=("pool_queue_mean", "mean"),
        rejected=("rejected", "sum"),
    )


def _episodes(ctx: DiagnoseContext) -> list[_Episode]:
    both = _fleet_router(ctx).join(_fleet_engine(ctx), how="inner").reset_index()
    if both.empty:
        return []
    per_replica = both["waiting"] / both["replicas"].clip(lower=1)
    kv_full = both["kv_max"] >= ctx.options.kv_full_ratio
    headroom = (per_replica <= HEADROOM_WAITING) & ~kv_full
    engines_saturated = (per_replica >= SATURATED_WAITING) | kv_full
    router_holds = (both["queue"] >= MIN_ROUTER_QUEUE) | (both["saturation"] >= SATURATED)
    # Only a router with flow control on (a saturation series) can be said to admit all.
    router_open = both["saturation"].notna() & (both["saturation"] < SATURATED)
    router_open &= both["queue"].fillna(0.0) < MIN_ROUTER_QUEUE
    out = []
    for kind, mask in (
        ("router_holds_back", router_holds & headroom),
        ("router_admits_all", router_open & engines_saturated),
    ):
        flagged = both[mask.fillna(False)]
        if len(flagged) < MIN_BUCKETS or len(flagged) < MIN_SHARE * len(both):
            continue
        span = episode(ctx, flagged)
        if span is not None:
            out.append(_Episode(kind, flagged, both, *span))
    return out


def _evidence(ctx: DiagnoseContext, ep: _Episode) -> dict[str, object]:
    f = ep.flagged
    routers = ctx.router[ctx.in_window(ctx.router)]
    return {
        "kind": ep.kind,
        "router": {
            "queue_mean": rnd(f["queue"].mean(), 2),
            "queue_peak": rnd(f["queue_peak"].max(), 2),
            "saturation_peak": rnd(num(f["saturation"].max()), 3),
            "pool_kv_usage_mean": rnd(num(f["pool_kv"].mean()), 3),
            "pool_queue_mean": rnd(num(f["pool_queue"].mean()), 2),
            "rejected": rnd(num(f["rejected"].sum()), 0),
            "routers": sorted(str(r) for r in routers["replica"].unique()),
        },
        "engines": {
            "replicas": int(f["replicas"].max()),
            "waiting_mean": rnd(f["waiting"].mean(), 2),
            "waiting_peak": rnd(f["waiting_peak"].max(), 2),
            "kv_peak": rnd(num(f["kv_max"].max()), 3),
            "running_mean": rnd(f["running"].mean(), 2),
        },
        "flagged_buckets": len(f),
        "router_buckets": len(ep.both),
        "router_queue_series": series(ctx, ep.both, "queue"),
    }


def _severity(ep: _Episode) -> Severity:
    share = len(ep.flagged) / max(1, len(ep.both))
    return "critical" if share >= 0.5 and ep.kind == "router_holds_back" else "warning"


@register
class GatewayQueueing:
    id = "gateway_queueing"
    needs = ("engine",)  # and the optional source ``router`` (not applicable without it)

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        if not ctx.has("router"):
            raise NotApplicable(
                "no gateway router series (llm-d router / Inference Extension EPP not scraped)"
            )
        out = []
        for ep in _episodes(ctx):
            ev = _evidence(ctx, ep)
            r, e = ev["router"], ev["engines"]
            assert isinstance(r, dict) and isinstance(e, dict)
            share = len(ep.flagged) / max(1, len(ep.both))
            if ep.kind == "router_holds_back":
                summary = (
                    f"the gateway router holds requests back (flow-control queue mean "
                    f"{r['queue_mean']}, peak {r['queue_peak']}; pool saturation peak "
                    f"{r['saturation_peak']}) while the engines have headroom (waiting mean "
                    f"{e['waiting_mean']} over {e['replicas']} replicas, KV peak "
                    f"{fmt_pct(num(e['kv_peak']))}) in {fmt_pct(share)} of the router's "
                    "buckets: its saturation detection or capacity limits are too tight"
                )
            else:
                summary = (
                    f"the engines are saturated (waiting mean {e['waiting_mean']} over "
                    f"{e['replicas']} replicas, KV peak {fmt_pct(num(e['kv_peak']))}) while "
                    f"the gateway router admits everything (pool saturation peak "
                    f"{r['saturation_peak']}, flow-control queue empty) in {fmt_pct(share)} of "
                    "the router's buckets: its saturation detection is misconfigured"
                )
            affected = requests_in(ctx, None, ep.start, ep.end)
            out.append(
                make_finding(
                    self.id,
                    severity=_severity(ep),
                    confidence=0.5
                    + 0.3 * min(1.0, share * 2)
                    + 0.1 * min(1.0, len(ep.flagged) / 6),
                    replica=None,
                    start=ep.start,
                    end=ep.end,
                    summary=summary,
                    evidence=ev,
                    impact=assess(ctx, None, affected),
                    options=ctx.options,
                )
            )
        return out
