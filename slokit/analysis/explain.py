"""Explain one request: where its time went, how it compares, and why.

The decomposition follows vLLM's own timestamps (span attributes): queue (arrival to first
scheduled), prefill (scheduled to first token), decode (first to last token); what E2E holds
beyond those is ``other_s`` (detokenization, API overhead), and what the client waited beyond
the server's E2E is ``client_s`` (network, gateway, HTTP). Context comes from the replica's
engine and GPU samples around the request's life. Missing sources are listed in ``unknown``
instead of being guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from slokit.analysis.slo_spec import SloSpec
from slokit.errors import NotFound
from slokit.store import queries as q
from slokit.timeutil import iso

#: Which runbook a dominant component points to when no finding is active.
DOMINANT_RUNBOOK = {
    "queue": "queue_saturation",
    "prefill": "prefill_saturation",
    "decode": "decode_saturation",
    "preemption": "kv_pressure",
    "client": "frontend_bound",
}


@dataclass(frozen=True)
class ExplainOptions:
    #: Peers are requests of the same class arriving within +/- the first of these windows
    #: that holds ``enough_peers`` (the last one otherwise).
    peer_windows_s: tuple[float, ...] = (60.0, 300.0, 1800.0)
    enough_peers: int = 200
    max_sample_age_s: float = 30.0  # an engine sample older than this at arrival is stale
    prefix_window_s: float = 60.0  # prefix-hit ratio over this long before arrival
    preemption_tpot_factor: float = 1.5  # TPOT this far above the peer median + preemptions
    min_peers: int = 10  # fewer peers than this: cannot call the request typical
    unusual_rank: float = 0.75  # E2E percentile rank at or above which a request is "slow"


def _share(part: float | None, total: float | None) -> float | None:
    if part is None or not total:
        return None
    return round(part / total, 4)


def _components(rec: dict[str, Any]) -> dict[str, Any]:
    e2e = rec.get("e2e_s")
    parts = {k: rec.get(k) for k in ("queue_s", "prefill_s", "decode_s")}
    known = [v for v in parts.values() if v is not None]
    other = None
    if e2e is not None and len(known) == 3:
        other = max(0.0, e2e - sum(known))
    client = None
    if rec.get("client_e2e_s") is not None and e2e is not None:
        client = max(0.0, rec["client_e2e_s"] - e2e)
    total = rec.get("client_e2e_s") if client is not None else e2e
    comps: dict[str, Any] = {**parts, "other_s": other, "client_s": client, "e2e_s": e2e}
    comps["client_e2e_s"] = rec.get("client_e2e_s")
    comps["ttft_s"] = rec.get("ttft_s")
    comps["client_ttft_s"] = rec.get("client_ttft_s")
    comps["tpot_s"] = rec.get("tpot_s")
    comps["shares"] = {
        k[:-2]: _share(comps[k], total)
        for k in ("queue_s", "prefill_s", "decode_s", "other_s", "client_s")
        if comps[k] is not None
    }
    return comps


def _timeline(rec: dict[str, Any]) -> list[dict[str, Any]]:
    arrival = rec.get("arrival_ts")
    if arrival is None:
        return []
    events: list[tuple[str, float | None]] = [("arrival", 0.0)]
    queue = rec.get("queue_s")
    if queue is not None:
        events.append(("scheduled", queue))
        if rec.get("prefill_s") is not None:
            events.append(("prefill_done", queue + rec["prefill_s"]))
    events.append(("first_token", rec.get("ttft_s")))
    events.append(("finish", rec.get("e2e_s")))
    if rec.get("client_e2e_s") is not None:
        events.append(("client_done", rec["client_e2e_s"]))
    return [
        {"event": name, "t_s": round(t, 6), "ts": iso(arrival + t)}
        for name, t in events
        if t is not None
    ]


def _dominant(comps: dict[str, Any], preempted: bool) -> str:
    candidates = {
        k[:-2]: comps[k]
        for k in ("queue_s", "prefill_s", "decode_s", "client_s")
        if comps.get(k) is not None
    }
    if not candidates:
        return "unknown"
    top = max(candidates, key=lambda k: candidates[k])
    if top == "decode" and preempted:
        return "preemption"
    return top


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _pct(v: float | None) -> str:
    return "?" if v is None else f"{v * 100:.0f}%"


def _cause(
    rec: dict[str, Any],
    comps: dict[str, Any],
    dominant: str,
    ctx: dict[str, Any],
    runbook: str | None,
) -> str:
    replica = rec.get("replica") or "its replica"
    state = ctx.get("replica_state_at_arrival") or {}
    during = ctx.get("during") or {}
    share = comps["shares"].get(dominant if dominant != "preemption" else "decode")
    share_txt = f" ({_pct(share)} of E2E)" if share is not None else ""
    kv = state.get("kv_usage_ratio")
    pre = during.get("preemptions")
    tail = []
    if kv is not None and kv >= 0.9:
        tail.append(f"KV cache was {_pct(kv)} full")
    if pre:
        tail.append(f"{pre:.0f} preemption{'s' if pre != 1 else ''} during its life")
    extra = (" while " + " with ".join(tail)) if tail else ""
    if dominant == "queue":
        waiting = state.get("waiting")
        behind = f" behind {waiting:.0f} waiting requests" if waiting is not None else ""
        running = state.get("running")
        run = f" ({running:.0f} running)" if running is not None else ""
        s = f"Queued {_fmt_s(comps['queue_s'])}{share_txt}{behind} on {replica}{run}{extra}"
    elif dominant == "prefill":
        prompt = rec.get("prompt_tokens")
        hit = state.get("prefix_hit_ratio")
        hit_txt = f", prefix-cache hit ratio {_pct(hit)}" if hit is not None else ""
        s = (
            f"Prefill took {_fmt_s(comps['prefill_s'])}{share_txt} for a "
            f"{prompt if prompt is not None else '?'}-token prompt on {replica}{hit_txt}{extra}"
        )
    elif dominant in ("decode", "preemption"):
        out = rec.get("output_tokens")
        tpot = comps.get("tpot_s")
        running = state.get("running")
        batch = f" with {running:.0f} requests running" if running is not None else ""
        s = (
            f"Decode of {out if out is not None else '?'} tokens took "
            f"{_fmt_s(comps['decode_s'])}{share_txt} (TPOT {_fmt_s(tpot)}){batch} on "
            f"{replica}{extra}"
        )
        if dominant == "preemption":
            s += "; preemption recompute stretched it"
    elif dominant == "client":
        s = (
            f"{_fmt_s(comps['client_s'])}{share_txt} was spent outside the engine "
            "(network, gateway, HTTP, tokenization)"
        )
    else:
        return "Not enough timing data to say where the time went."
    rank = (ctx.get("percentile_rank") or {}).get("e2e_s")
    if rank and rank.get("rank") is not None and ctx.get("peers", 0) >= 10:
        s += (
            f"; its E2E is at the {_ordinal(rank['rank'] * 100)} percentile of {ctx['peers']} peers"
        )
    if runbook:
        s += f"; see {runbook}"
    return s + "."


def _ordinal(p: float) -> str:
    n = round(p)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _is_unusual(ctx: dict[str, Any], slo: dict[str, Any] | None, opt: ExplainOptions) -> bool:
    """Slow for its peers, or bad by its SLO: only then does a runbook apply."""
    if slo is not None and slo.get("good") is False:
        return True
    rank = (ctx.get("percentile_rank") or {}).get("e2e_s") or {}
    if ctx.get("peers", 0) < opt.min_peers or rank.get("rank") is None:
        return True  # too few peers to call it typical
    return bool(rank["rank"] >= opt.unusual_rank)


def _slo(rec: dict[str, Any], spec: SloSpec | None) -> dict[str, Any] | None:
    """The request judged by its SLO class, with the same rules as the SLI (analysis.slo)."""
    if spec is None:
        return None
    from slokit.analysis.slo import bound_results, classify, measurement

    name, outcome = classify(rec, spec)
    if name is None:
        return {"class": None, "outcome": outcome, "good": None, "reason": "matches no SLO class"}
    cls = spec.class_named(name)
    checks = {}
    for key, ok in bound_results(rec, cls).items():
        v = measurement(rec, key.removesuffix("_ms"))
        checks[key] = {
            "bound": cls.bounds_ms()[key],
            "value": None if v is None else round(v * 1000, 3),
            "ok": ok,
        }
    return {
        "class": name,
        "objective": cls.objective,
        "outcome": outcome,
        "good": outcome == "good",
        "checks": checks,
    }


def explain_request(
    con: duckdb.DuckDBPyConnection,
    request_id: str,
    *,
    spec: SloSpec | None = None,
    options: ExplainOptions | None = None,
) -> dict[str, Any]:
    """The explain document for one request (docs/schema/explain.schema.json). Raises NotFound."""
    opt = options or ExplainOptions()
    rec = q.get_request(con, request_id)
    if rec is None:
        raise NotFound(f"no request {request_id!r} in the store")
    unknown: list[str] = []
    comps = _components(rec)
    arrival: float | None = rec.get("arrival_ts")
    finish: float = rec.get("finish_ts") or arrival or 0.0
    replica = rec.get("replica")
    ctx: dict[str, Any] = {"replica_state_at_arrival": None, "during": None, "gpu_at_arrival": None}
    for missing, what in (
        ("vllm", "no vLLM span: queue/prefill/decode split unknown"),
        ("client", "no client record: client-side latency unknown"),
    ):
        if missing not in rec["sources"]:
            unknown.append(what)
    preempted = False
    if arrival is not None:
        window = opt.peer_windows_s[-1]
        for w in opt.peer_windows_s:  # the narrowest window with enough peers: cheap on busy stores
            if (
                q.peer_count(con, arrival - w, arrival + w, rec.get("slo_class"))
                >= opt.enough_peers
            ):
                window = w
                break
        peers = q.percentile_ranks(
            con,
            values={k: comps.get(k) for k in ("ttft_s", "tpot_s", "e2e_s")},
            since=arrival - window,
            until=arrival + window,
            slo_class=rec.get("slo_class"),
        )
        ctx["peer_window_s"] = window
        ctx["peers"] = peers["peers"]
        ctx["percentile_rank"] = peers["ranks"]
    if replica is None:
        unknown.append("replica unknown: no engine or GPU context")
    elif arrival is not None:
        lookback = max(opt.max_sample_age_s, opt.prefix_window_s)
        samples = q.engine_window(con, replica, arrival - lookback, finish)
        before = [s for s in samples if s["ts"] <= arrival]
        state = (
            before[-1] if before and arrival - before[-1]["ts"] <= opt.max_sample_age_s else None
        )
        if state is None:
            if q.has_rows(con, "engine_samples", replica):
                unknown.append(
                    f"no engine sample of {replica} within {opt.max_sample_age_s:.0f} s "
                    "before arrival (telemetry gap)"
                )
            else:
                unknown.append(
                    f"no engine samples for replica {replica}: queue depth and KV state unknown"
                )
        else:
            recent = [s for s in before if s["ts"] >= arrival - opt.prefix_window_s]
            hits, _ = q.increase(
                [
                    s["prefix_cache_hits_total"]
                    for s in recent
                    if s["prefix_cache_hits_total"] is not None
                ]
            )
            queries, _ = q.increase(
                [
                    s["prefix_cache_queries_total"]
                    for s in recent
                    if s["prefix_cache_queries_total"] is not None
                ]
            )
            hit_ratio = hits / queries if hits is not None and queries else None
            ctx["replica_state_at_arrival"] = {
                "ts": iso(state["ts"]),
                "age_s": round(arrival - state["ts"], 3),
                "running": state["running"],
                "waiting": state["waiting"],
                "kv_usage_ratio": state["kv_usage_ratio"],
                "prefix_hit_ratio": hit_ratio,
                "num_gpu_blocks": state["num_gpu_blocks"],
            }
            life = [state, *(s for s in samples if s["ts"] > arrival)]
            pre, resets = q.increase(
                [s["preemptions_total"] for s in life if s["preemptions_total"] is not None]
            )
            inside = [s for s in samples if arrival <= s["ts"] <= finish]

            def _max(key: str) -> float | None:
                vals = [s[key] for s in inside if s[key] is not None]
                return max(vals) if vals else None

            running = [s["running"] for s in inside if s["running"] is not None]
            ctx["during"] = {
                "preemptions": pre,
                "counter_resets": resets,
                "kv_usage_max": _max("kv_usage_ratio"),
                "waiting_max": _max("waiting"),
                "running_avg": sum(running) / len(running) if running else None,
                "samples": len(inside),
            }
            if resets:
                unknown.append(f"{replica}'s counters reset during the request (restart?)")
            tpot = comps.get("tpot_s")
            peer_tpot = (ctx.get("percentile_rank") or {}).get("tpot_s", {}).get("p50")
            if (pre or 0) > 0 and tpot and peer_tpot:
                preempted = tpot > opt.preemption_tpot_factor * peer_tpot
            if (rec.get("preemptions") or 0) > 0:
                preempted = True
        gpu = q.gpu_state_at(con, replica, arrival, max_age_s=opt.max_sample_age_s)
        if gpu is None:
            unknown.append(f"no GPU samples for {replica}: GPU utilization unknown")
        else:
            ctx["gpu_at_arrival"] = {
                k: gpu[k]
                for k in (
                    "gpu",
                    "util_ratio",
                    "mem_used_mib",
                    "power_w",
                    "sm_clock_mhz",
                    "xid_last",
                )
            }
    findings = []
    if arrival is not None:
        findings = [
            {
                **{k: v for k, v in f.items() if k not in ("start_ts", "end_ts")},
                "start": iso(f["start_ts"]),
                "end": iso(f["end_ts"]),
            }
            for f in q.findings_overlapping(con, replica, arrival, finish)
        ]
    dominant = _dominant(comps, preempted)
    slo = _slo(rec, spec)
    unusual = _is_unusual(ctx, slo, opt)
    # Info-level findings (a telemetry gap, a mild drift) are context, not the cause.
    actionable = [f for f in findings if f["severity"] != "info"]
    runbook = None
    if actionable:
        runbook = actionable[0]["runbook"]
    elif dominant in DOMINANT_RUNBOOK and unusual:
        runbook = f"runbooks/{DOMINANT_RUNBOOK[dominant]}.md"
    cause = _cause(rec, comps, dominant, ctx, runbook)
    if not unusual and not actionable:
        cause = cause[:-1] + "; typical for its peers, nothing to fix."
    return {
        "request_id": rec["request_id"],
        "trace_id": rec.get("trace_id"),
        "replica": replica,
        "model": rec.get("model"),
        "slo_class": rec.get("slo_class"),
        "status": rec.get("status"),
        "sources": list(rec["sources"]),
        "tokens": {
            k: rec.get(k) for k in ("prompt_tokens", "output_tokens", "cached_tokens", "max_tokens")
        },
        "timeline": _timeline(rec),
        "components": comps,
        "dominant": dominant,
        "cause": cause,
        "context": ctx,
        "findings": findings,
        "slo": slo,
        "runbook": runbook,
        "unknown": unknown,
    }


def render_text(doc: dict[str, Any]) -> str:
    """The explain document as text for a person at 3 a.m."""
    c = doc["components"]
    lines = [
        f"request {doc['request_id']}  replica={doc['replica'] or '?'}  model={doc['model'] or '?'}"
        f"  class={doc['slo_class'] or '-'}  status={doc['status'] or '?'}  sources={','.join(doc['sources'])}",
        "",
        f"cause: {doc['cause']}",
        "",
        "timeline (from arrival):",
    ]
    for ev in doc["timeline"]:
        lines.append(f"  {ev['t_s'] * 1000:10.1f} ms  {ev['event']:<13} {ev['ts']}")
    lines += ["", f"components (dominant: {doc['dominant']}):"]
    for key in ("queue_s", "prefill_s", "decode_s", "other_s", "client_s"):
        v = c.get(key)
        if v is None:
            continue
        share = c["shares"].get(key[:-2])
        bar = "#" * round((share or 0) * 40)
        lines.append(f"  {key[:-2]:<8} {v * 1000:10.1f} ms  {_pct(share):>4}  {bar}")
    for key in ("ttft_s", "tpot_s", "e2e_s", "client_ttft_s", "client_e2e_s"):
        if c.get(key) is not None:
            lines.append(f"  {key:<14} {c[key] * 1000:10.1f} ms")
    ctx = doc["context"]
    ranks = ctx.get("percentile_rank") or {}
    if ranks:
        lines += [
            "",
            f"vs {ctx.get('peers', 0)} peers (same class, +/-{ctx.get('peer_window_s', 0):.0f} s):",
        ]
        for k, r in ranks.items():
            if r.get("rank") is not None:
                lines.append(
                    f"  {k:<7} rank {r['rank'] * 100:5.1f}%  peer p50 {_fmt_s(r['p50'])}  p95 {_fmt_s(r['p95'])}"
                )
    st = ctx.get("replica_state_at_arrival")
    if st:
        lines += [
            "",
            f"replica at arrival ({st['age_s']:.1f} s old sample): waiting={st['waiting']} running={st['running']} "
            f"kv={_pct(st['kv_usage_ratio'])} prefix-hit={_pct(st['prefix_hit_ratio'])}",
        ]
    dur = ctx.get("during")
    if dur:
        lines.append(
            f"during its life: preemptions={dur['preemptions'] if dur['preemptions'] is not None else '?'} "
            f"kv max={_pct(dur['kv_usage_max'])} waiting max={dur['waiting_max']}"
        )
    gpu = ctx.get("gpu_at_arrival")
    if gpu:
        lines.append(
            f"GPU {gpu['gpu']}: util={_pct(gpu['util_ratio'])} power={gpu['power_w']} W "
            f"SM clock={gpu['sm_clock_mhz']} MHz xid={gpu['xid_last']}"
        )
    if doc["findings"]:
        lines += ["", "active findings:"]
        for f in doc["findings"]:
            lines.append(f"  [{f['severity']}] {f['rule']}: {f['summary']} ({f['runbook']})")
    slo = doc.get("slo")
    if slo:
        verdict = {True: "good", False: "BAD", None: "unknown"}[slo.get("good")]
        lines += ["", f"SLO class {slo.get('class')}: {verdict}"]
        for k, chk in (slo.get("checks") or {}).items():
            lines.append(f"  {k} <= {chk['bound']}: {chk['value']} -> {chk['ok']}")
    if doc["unknown"]:
        lines += ["", "cannot know:"]
        lines += [f"  - {u}" for u in doc["unknown"]]
    if doc["runbook"]:
        lines += ["", f"runbook: {doc['runbook']}"]
    return "\n".join(lines)
