"""Why: whether the request is unusual, which runbook applies, and the cause sentence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slokit.analysis.explain._format import fmt_s, ordinal, pct
from slokit.analysis.explain._model import (
    Components,
    Dominant,
    OverlappingFinding,
    RootCause,
    SloJudgement,
)
from slokit.analysis.explain._model_context import Context
from slokit.analysis.explain._options import ExplainOptions
from slokit.analysis.rules import runbook_path
from slokit.records import Finding

#: Which runbook a dominant component points to when no finding is active.
DOMINANT_RUNBOOK: dict[str, str] = {
    "queue": "queue_saturation",
    "prefill": "prefill_saturation",
    "decode": "decode_saturation",
    "frontend": "frontend_bound",
    "preemption": "kv_pressure",
    "client": "frontend_bound",
}

_RANK_MIN_PEERS = 10  # fewer peers than this: the cause does not quote the request's rank


def is_unusual(context: Context, slo: SloJudgement | None, opt: ExplainOptions) -> bool:
    """Slow for its peers, or bad by its SLO: only then does a runbook apply."""
    if slo is not None and slo.good is False:
        return True
    rank = _e2e_rank(context)
    if rank is None or context.peers is None or context.peers.count < opt.min_peers:
        return True  # too few peers to call it typical
    return rank >= opt.unusual_rank


#: The findings that explain a dominant component, most direct first.
SYMPTOM_RULES: dict[str, tuple[str, ...]] = {
    "queue": ("queue_saturation", "beyond_knee", "prefill_saturation"),
    "prefill": ("prefill_saturation", "queue_saturation", "beyond_knee"),
    "decode": ("decode_saturation", "kv_pressure", "gpu_throttle"),
    "preemption": ("kv_pressure", "decode_saturation"),
    "frontend": ("frontend_bound",),
    "client": ("frontend_bound",),
}


def root_cause(linked: Sequence[Finding], dominant: Dominant) -> RootCause | None:
    """The root of the causal chain behind the actionable finding that explains the
    dominant component (else the most severe actionable one); None without one."""
    actionable = [f for f in linked if f.severity != "info"]
    if not actionable:
        return None
    wanted = SYMPTOM_RULES.get(dominant, ())
    ranked = sorted(
        actionable, key=lambda f: wanted.index(f.rule) if f.rule in wanted else len(wanted)
    )
    symptom = ranked[0]
    by_id = {f.id: f for f in linked}
    node, reason, explains = symptom, None, None
    seen = {symptom.id}
    while node.caused_by and node.caused_by[0]["id"] in by_id:
        link = node.caused_by[0]
        if link["id"] in seen:
            break
        seen.add(link["id"])
        explains, reason, node = node.id, link["reason"], by_id[link["id"]]
    return RootCause(
        id=node.id or node.rule,
        rule=node.rule,
        replica=node.replica,
        summary=node.summary,
        runbook=node.runbook,
        explains=explains,
        reason=reason,
    )


def choose_runbook(
    findings: Sequence[OverlappingFinding],
    dominant: Dominant,
    unusual: bool,
    root: RootCause | None = None,
) -> str | None:
    """The root cause's runbook, else the first actionable finding's, else the dominant
    component's when the request is unusual, else none."""
    if root is not None:
        return root.runbook
    actionable = [f for f in findings if f.actionable]
    if actionable:
        return actionable[0].runbook
    if dominant in DOMINANT_RUNBOOK and unusual:
        return runbook_path(DOMINANT_RUNBOOK[dominant])
    return None


def cause(
    rec: Mapping[str, Any],
    comps: Components,
    dominant: Dominant,
    context: Context,
    runbook: str | None,
    *,
    typical: bool,
    root: RootCause | None = None,
) -> str:
    """One sentence for a person: the dominant component with what explains it, the root
    cause behind it, the rank among peers, and the runbook (or that it is typical and there
    is nothing to fix)."""
    s = _what(rec, comps, dominant, context)
    if s is not None:
        if root is not None and root.reason:
            s += f" because {root.reason} ({root.rule})"
        rank, peers = _e2e_rank(context), context.peers
        if rank is not None and peers is not None and peers.count >= _RANK_MIN_PEERS:
            s += f"; its E2E is at the {ordinal(rank * 100)} percentile of {peers.count} peers"
        if runbook:
            s += f"; see {runbook}"
    else:
        s = "Not enough timing data to say where the time went"
    if typical:
        return s + "; typical for its peers, nothing to fix."
    return s + "."


def _e2e_rank(context: Context) -> float | None:
    peer = context.peers.ranks.get("e2e_s") if context.peers is not None else None
    return peer.rank if peer is not None else None


def _what(
    rec: Mapping[str, Any], comps: Components, dominant: Dominant, context: Context
) -> str | None:
    """Where the time went, in words; None when no component is known."""
    replica = rec.get("replica") or "its replica"
    state = context.replica_state_at_arrival
    shares = comps.shares()
    share = shares.get(dominant if dominant != "preemption" else "decode")
    share_txt = f" ({pct(share)} of E2E)" if share is not None else ""
    running = state.running if state is not None else None
    if dominant == "queue":
        waiting = state.waiting if state is not None else None
        behind = f" behind {waiting:.0f} waiting requests" if waiting is not None else ""
        run = f" ({running:.0f} running)" if running is not None else ""
        return (
            f"Queued {fmt_s(comps.queue_s)}{share_txt}{behind} on {replica}{run}"
            f"{_engine_trouble(context)}"
        )
    if dominant == "prefill":
        prompt = rec.get("prompt_tokens")
        hit = state.prefix_hit_ratio if state is not None else None
        hit_txt = f", prefix-cache hit ratio {pct(hit)}" if hit is not None else ""
        return (
            f"Prefill took {fmt_s(comps.prefill_s)}{share_txt} for a "
            f"{prompt if prompt is not None else '?'}-token prompt on {replica}{hit_txt}"
            f"{_engine_trouble(context)}"
        )
    if dominant in ("decode", "preemption"):
        out = rec.get("output_tokens")
        batch = f" with {running:.0f} requests running" if running is not None else ""
        s = (
            f"Decode of {out if out is not None else '?'} tokens took "
            f"{fmt_s(comps.decode_s)}{share_txt} (TPOT {fmt_s(comps.tpot_s)}){batch} on "
            f"{replica}{_engine_trouble(context)}"
        )
        return s + "; preemption recompute stretched it" if dominant == "preemption" else s
    if dominant == "frontend":
        return (
            f"{fmt_s(comps.frontend_s)}{share_txt} was spent in vLLM's API server outside the "
            "engine (frontend: HTTP, tokenisation, detokenisation, streaming) on "
            f"{replica}"
        )
    if dominant == "client":
        return (
            f"{fmt_s(comps.client_s)}{share_txt} was spent before vLLM stamped the request's "
            "arrival or after its last output (network, gateway, the API server reading the "
            "request or waiting for CPU)"
        )
    return None


def _engine_trouble(context: Context) -> str:
    """`` while KV cache was 98% full with 2 preemptions during its life``, or nothing."""
    state, during = context.replica_state_at_arrival, context.during
    kv = state.kv_usage_ratio if state is not None else None
    pre = during.preemptions if during is not None else None
    tail = []
    if kv is not None and kv >= 0.9:
        tail.append(f"KV cache was {pct(kv)} full")
    if pre:
        tail.append(f"{pre:.0f} preemption{'s' if pre != 1 else ''} during its life")
    return (" while " + " with ".join(tail)) if tail else ""
