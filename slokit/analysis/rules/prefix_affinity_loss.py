"""prefix_affinity_loss: the prefix-cache hit ratio falls after the fleet grows.

Each vLLM replica caches the KV blocks of prompts it has seen. With cache-unaware
(round-robin, least-connections) routing, adding replicas spreads requests that share a
prefix across caches that have never seen it, so each replica's hit ratio and the fleet's
fall and the prefill work they saved comes back. The rule compares the fleet hit ratio
(prefix-cache hits / queries, in tokens, from counter increases) before and after the first
bucket in which more replicas serve traffic than during the baseline. A fall without any
scale-out is still reported, with lower confidence (cache disabled or evicted, or a
workload with fewer shared prefixes).
"""

from __future__ import annotations

import pandas as pd

from slokit.analysis.impact import assess, requests_in
from slokit.analysis.rules import NotApplicable, register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._util import fmt_pct, make_finding, num, ratio, rnd, series, whole
from slokit.records import Finding, Severity

#: engine_buckets' per-bucket increases of vLLM's ``prompt_tokens_by_source`` -> source.
PROMPT_SOURCES = (
    ("prompt_computed", "local_compute"),
    ("prompt_cached", "local_cache_hit"),
    ("prompt_external", "external_kv_transfer"),
)


def prompt_tokens_by_source(frame: pd.DataFrame) -> dict[str, float] | None:
    """Prompt tokens over ``frame``'s buckets by where their KV came from (computed, the local
    prefix cache, a KV connector), or None when vLLM does not expose the split."""
    out: dict[str, float] = {}
    for col, source in PROMPT_SOURCES:
        if col in frame.columns and frame[col].notna().any():
            out[source] = float(frame[col].sum())
    return out or None


def _active(frame: pd.DataFrame) -> pd.Series:
    return (frame["prefix_queries"].fillna(0) > 0) | (frame["prompt_tokens"].fillna(0) > 0)


@register
class PrefixAffinityLoss:
    id = "prefix_affinity_loss"
    needs = ("engine",)

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        o = ctx.options
        eng = ctx.engine
        if eng["prefix_queries"].fillna(0).sum() <= 0:
            raise NotApplicable("no prefix-cache query counters (prefix caching off or unexported)")
        eng = eng.assign(active=_active(eng))
        fleet = (
            eng.groupby("bucket")
            .agg(
                hits=("prefix_hits", "sum"),
                queries=("prefix_queries", "sum"),
                replicas=("active", "sum"),
            )
            .reset_index()
        )
        fleet["hit_ratio"] = fleet["hits"] / fleet["queries"].where(fleet["queries"] > 0)
        base = fleet[ctx.is_baseline(fleet)]
        detect = fleet[ctx.is_detect(fleet)]
        base_ratio = ratio(base["hits"].sum(), base["queries"].sum())
        if base_ratio is None or detect.empty:
            ctx.note(self.id, "no prefix-cache queries in the baseline; nothing to compare")
            return []
        base_replicas = int(base["replicas"].median()) if not base.empty else 0
        grown = detect[detect["replicas"] > base_replicas]
        scale_out = not grown.empty
        start = ctx.bucket_start(
            int(grown["bucket"].min() if scale_out else detect["bucket"].min())
        )
        after = fleet[(ctx.origin + fleet["bucket"] * o.bucket_s) >= start]
        after_ratio = ratio(after["hits"].sum(), after["queries"].sum())
        if after_ratio is None:
            return []
        drop = base_ratio - after_ratio
        if drop < o.prefix_min_abs_drop or after_ratio > (1 - o.prefix_drop_ratio) * base_ratio:
            return []
        after_replicas = int(after["replicas"].max())
        per_replica = {}
        for replica, rows in eng.groupby("replica"):
            b, a = (
                rows[ctx.is_baseline(rows)],
                rows[(ctx.origin + rows["bucket"] * o.bucket_s) >= start],
            )
            per_replica[str(replica)] = {
                "baseline": rnd(ratio(b["prefix_hits"].sum(), b["prefix_queries"].sum())),
                "after": rnd(ratio(a["prefix_hits"].sum(), a["prefix_queries"].sum())),
            }
        lost_tokens = drop * float(after["queries"].sum())
        summary = (
            f"fleet prefix-cache hit ratio {fmt_pct(after_ratio)} vs "
            f"{fmt_pct(base_ratio)} baseline ({drop * 100:.0f} points lower)"
        )
        if scale_out:
            summary += (
                f" after replicas serving traffic grew {base_replicas} -> "
                f"{after_replicas}; cache-unaware routing spreads shared prefixes"
            )
        else:
            summary += (
                f" with no scale-out ({base_replicas} replicas): cache disabled, "
                "evicted, or fewer shared prefixes"
            )
        summary += f"; ~{lost_tokens:,.0f} more prompt tokens prefilled"
        evidence: dict[str, object] = {
            "hit_ratio_baseline": rnd(base_ratio),
            "hit_ratio_after": rnd(after_ratio),
            "replicas_baseline": base_replicas,
            "replicas_after": after_replicas,
            "scale_out": scale_out,
            "extra_prefill_tokens": whole(lost_tokens),
            "per_replica": per_replica,
            "hit_ratio_series": series(ctx, fleet, "hit_ratio"),
            "replicas_series": series(ctx, fleet, "replicas"),
            "queries_after_tokens": num(after["queries"].sum()),
        }
        eng_after = eng[(ctx.origin + eng["bucket"] * o.bucket_s) >= start]
        for key, rows in (("baseline", eng[ctx.is_baseline(eng)]), ("after", eng_after)):
            by_source = prompt_tokens_by_source(rows)
            if by_source is not None:
                evidence[f"prompt_tokens_by_source_{key}"] = {
                    k: whole(v) for k, v in by_source.items()
                }
        severity: Severity = (
            "critical" if after_ratio <= 0.5 * base_ratio and scale_out else "warning"
        )
        confidence = (0.85 if scale_out else 0.45) + 0.1 * min(1.0, drop / 0.5)
        last = ctx.bucket_end(int(fleet["bucket"].max()))
        return [
            make_finding(
                self.id,
                severity=severity,
                confidence=confidence,
                replica=None,
                start=start,
                end=last,
                summary=summary,
                evidence=evidence,
                # The requests after the change that lost the prefix hit they used to get:
                # the share of the baseline's hits that is gone.
                impact=assess(ctx, None, requests_in(ctx, None, start, last) * drop / base_ratio),
                options=o,
            )
        ]
