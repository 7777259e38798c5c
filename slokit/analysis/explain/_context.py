"""What surrounded a request, all asked of the :class:`~slokit.store.reader.Reader`: its
peers, its replica's engine state at arrival and during its life, the GPU at arrival, and
the stored findings that overlap it. What the data cannot tell goes to ``unknown``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slokit.analysis.causality import analyse, from_stored
from slokit.analysis.counters import increase
from slokit.analysis.explain._model import Components, OverlappingFinding
from slokit.analysis.explain._model_context import (
    Context,
    During,
    GpuState,
    PeerRank,
    Peers,
    ReplicaState,
)
from slokit.analysis.explain._options import ExplainOptions
from slokit.records import Finding
from slokit.store.reader import Reader
from slokit.timeutil import iso

_RANKED = ("ttft_s", "tpot_s", "e2e_s")  # the metrics a request is ranked on among its peers


@dataclass(frozen=True)
class Gathered:
    context: Context
    findings: tuple[OverlappingFinding, ...]
    #: The same findings with their causal links recomputed (stored findings carry none).
    linked: tuple[Finding, ...]
    preempted: bool  # preemption recompute stretched the request's decode
    unknown: tuple[str, ...]


def gather(
    reader: Reader, rec: Mapping[str, Any], comps: Components, opt: ExplainOptions
) -> Gathered:
    """The request's context, the findings overlapping it, and what cannot be known."""
    unknown: list[str] = []
    if "vllm" not in rec["sources"]:
        unknown.append("no vLLM span: queue/prefill/decode split unknown")
    if "client" not in rec["sources"]:
        unknown.append("no client record: client-side latency unknown")
    arrival: float | None = rec.get("arrival_ts")
    finish: float = rec.get("finish_ts") or arrival or 0.0
    replica: str | None = rec.get("replica")
    peers = None if arrival is None else _peers(reader, rec, comps, arrival, opt)
    state = during = gpu = None
    preempted = False
    if replica is None:
        unknown.append("replica unknown: no engine or GPU context")
    elif arrival is not None:
        samples = reader.engine_window(
            replica, arrival - max(opt.max_sample_age_s, opt.prefix_window_s), finish
        )
        before = [s for s in samples if s["ts"] <= arrival]
        last = before[-1] if before else None
        if last is None or arrival - last["ts"] > opt.max_sample_age_s:
            unknown.append(_no_state(reader, replica, opt))
        else:
            state = _state_at_arrival(last, before, arrival, opt)
            during = _during(last, samples, arrival, finish)
            if during.counter_resets:
                unknown.append(f"{replica}'s counters reset during the request (restart?)")
            preempted = _preempted(rec, comps, during, peers, opt)
        gpu = _gpu_at_arrival(reader, replica, arrival, opt)
        if gpu is None:
            unknown.append(f"no GPU samples for {replica}: GPU utilization unknown")
    rows = [] if arrival is None else reader.findings_overlapping(replica, arrival, finish)
    context = Context(state, during, gpu, peers)
    return Gathered(context, _findings(rows), _linked(rows), preempted, tuple(unknown))


def _peers(
    reader: Reader, rec: Mapping[str, Any], comps: Components, arrival: float, opt: ExplainOptions
) -> Peers:
    """Percentile ranks among the narrowest window of peers that holds enough of them
    (cheap on busy stores)."""
    slo_class: str | None = rec.get("slo_class")
    window = opt.peer_windows_s[-1]
    for w in opt.peer_windows_s:
        if reader.peer_count(arrival - w, arrival + w, slo_class) >= opt.enough_peers:
            window = w
            break
    found = reader.percentile_ranks(
        values={k: getattr(comps, k) for k in _RANKED},
        since=arrival - window,
        until=arrival + window,
        slo_class=slo_class,
    )
    ranks = {k: PeerRank(r["rank"], r["p50"], r["p95"]) for k, r in found["ranks"].items()}
    return Peers(window, found["peers"], ranks)


def _no_state(reader: Reader, replica: str, opt: ExplainOptions) -> str:
    if reader.has_engine_samples(replica):
        return (
            f"no engine sample of {replica} within {opt.max_sample_age_s:.0f} s "
            "before arrival (telemetry gap)"
        )
    return f"no engine samples for replica {replica}: queue depth and KV state unknown"


def _state_at_arrival(
    last: Mapping[str, Any],
    before: Sequence[Mapping[str, Any]],
    arrival: float,
    opt: ExplainOptions,
) -> ReplicaState:
    """The last sample before arrival, with the prefix-cache hit ratio over the window
    before it (from the counters' increases)."""
    recent = [s for s in before if s["ts"] >= arrival - opt.prefix_window_s]
    hits, _ = increase(_series(recent, "prefix_cache_hits_total"))
    queries, _ = increase(_series(recent, "prefix_cache_queries_total"))
    return ReplicaState(
        ts=iso(last["ts"]),
        age_s=round(arrival - last["ts"], 3),
        running=last["running"],
        waiting=last["waiting"],
        kv_usage_ratio=last["kv_usage_ratio"],
        prefix_hit_ratio=hits / queries if hits is not None and queries else None,
        num_gpu_blocks=last["num_gpu_blocks"],
    )


def _during(
    last: Mapping[str, Any], samples: Sequence[Mapping[str, Any]], arrival: float, finish: float
) -> During:
    """Preemptions (counter increase from the sample at arrival on) and the engine's peaks
    over the request's life."""
    life = [last, *(s for s in samples if s["ts"] > arrival)]
    preemptions, resets = increase(_series(life, "preemptions_total"))
    inside = [s for s in samples if arrival <= s["ts"] <= finish]
    running = _series(inside, "running")
    kv_usage = _series(inside, "kv_usage_ratio")
    waiting = _series(inside, "waiting")
    return During(
        preemptions=preemptions,
        counter_resets=resets,
        kv_usage_max=max(kv_usage) if kv_usage else None,
        waiting_max=max(waiting) if waiting else None,
        running_avg=sum(running) / len(running) if running else None,
        samples=len(inside),
    )


def _series(samples: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [s[key] for s in samples if s[key] is not None]


def _preempted(
    rec: Mapping[str, Any],
    comps: Components,
    during: During,
    peers: Peers | None,
    opt: ExplainOptions,
) -> bool:
    """The request was preempted (its own count), or preemptions happened during its life
    and its TPOT is well above its peers' median."""
    if (rec.get("preemptions") or 0) > 0:
        return True
    peer = peers.ranks.get("tpot_s") if peers is not None else None
    peer_tpot = peer.p50 if peer is not None else None
    tpot = comps.tpot_s
    if (during.preemptions or 0) > 0 and tpot and peer_tpot:
        return tpot > opt.preemption_tpot_factor * peer_tpot
    return False


def _gpu_at_arrival(
    reader: Reader, replica: str, arrival: float, opt: ExplainOptions
) -> GpuState | None:
    gpu = reader.gpu_state_at(replica, arrival, max_age_s=opt.max_sample_age_s)
    if gpu is None:
        return None
    return GpuState(
        gpu=gpu["gpu"],
        util_ratio=gpu["util_ratio"],
        mem_used_mib=gpu["mem_used_mib"],
        power_w=gpu["power_w"],
        sm_clock_mhz=gpu["sm_clock_mhz"],
        xid_last=gpu["xid_last"],
    )


def _findings(rows: Sequence[Mapping[str, Any]]) -> tuple[OverlappingFinding, ...]:
    """Stored findings overlapping the request's life, most severe first."""
    return tuple(
        OverlappingFinding(
            rule=f["rule"],
            severity=f["severity"],
            confidence=f["confidence"],
            replica=f["replica"],
            summary=f["summary"],
            runbook=f["runbook"],
            start=iso(f["start_ts"]),
            end=iso(f["end_ts"]),
        )
        for f in rows
    )


def _linked(rows: Sequence[Mapping[str, Any]]) -> tuple[Finding, ...]:
    """The stored findings with their links recomputed. The store keeps no evidence for
    them to be read back, so a chain whose evidence is absent is taken on its scope and
    timing (the diagnosis that stored them judged the evidence)."""
    return tuple(analyse([from_stored(r) for r in rows], strict=False).findings)
