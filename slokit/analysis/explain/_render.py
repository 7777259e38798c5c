"""The explain document as text for a person at 3 a.m.

It renders the JSON document, not the :class:`Explanation`: ``slokit explain --sidecar``
gets the document over HTTP, possibly from an older sidecar whose components name the
frontend time ``other_s`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slokit.analysis.explain._format import fmt_s, pct
from slokit.analysis.explain._model import COMPONENTS

#: Older documents (before ``frontend_s``) name the frontend time ``other``.
_OLD_NAMES = {"frontend": "other"}


def render_text(doc: Mapping[str, Any]) -> str:
    """The explain document (as ``explain_request`` returns it) as text."""
    lines = [
        f"request {doc['request_id']}  replica={doc['replica'] or '?'}  model={doc['model'] or '?'}"
        f"  class={doc['slo_class'] or '-'}  status={doc['status'] or '?'}  sources={','.join(doc['sources'])}",
        "",
        *_gateway(doc.get("gateway")),
        f"cause: {doc['cause']}",
        *_root_cause(doc.get("root_cause")),
        "",
        "timeline (from arrival):",
    ]
    for ev in doc["timeline"]:
        lines.append(f"  {ev['t_s'] * 1000:10.1f} ms  {ev['event']:<13} {ev['ts']}")
    lines += ["", f"components (dominant: {doc['dominant']}):"]
    lines += _components(doc["components"])
    lines += _context(doc["context"])
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


def _components(c: Mapping[str, Any]) -> list[str]:
    lines = []
    for name in COMPONENTS:
        key = name if f"{name}_s" in c else _OLD_NAMES.get(name, name)
        v = c.get(f"{key}_s")
        if v is None:
            continue
        share = c["shares"].get(key)
        bar = "#" * round((share or 0) * 40)
        lines.append(f"  {name:<8} {v * 1000:10.1f} ms  {pct(share):>4}  {bar}")
    for key in ("ttft_s", "tpot_s", "e2e_s", "client_ttft_s", "client_e2e_s"):
        if c.get(key) is not None:
            lines.append(f"  {key:<14} {c[key] * 1000:10.1f} ms")
    return lines


def _context(ctx: Mapping[str, Any]) -> list[str]:
    lines = []
    ranks = ctx.get("percentile_rank") or {}
    if ranks:
        lines += [
            "",
            f"vs {ctx.get('peers', 0)} peers (same class, +/-{ctx.get('peer_window_s', 0):.0f} s):",
        ]
        for k, r in ranks.items():
            if r.get("rank") is not None:
                lines.append(
                    f"  {k:<7} rank {r['rank'] * 100:5.1f}%  peer p50 {fmt_s(r['p50'])}  p95 {fmt_s(r['p95'])}"
                )
    st = ctx.get("replica_state_at_arrival")
    if st:
        lines += [
            "",
            f"replica at arrival ({st['age_s']:.1f} s old sample): waiting={st['waiting']} running={st['running']} "
            f"kv={pct(st['kv_usage_ratio'])} prefix-hit={pct(st['prefix_hit_ratio'])}",
        ]
    dur = ctx.get("during")
    if dur:
        lines.append(
            f"during its life: preemptions={dur['preemptions'] if dur['preemptions'] is not None else '?'} "
            f"kv max={pct(dur['kv_usage_max'])} waiting max={dur['waiting_max']}"
        )
    gpu = ctx.get("gpu_at_arrival")
    if gpu:
        lines.append(
            f"GPU {gpu['gpu']}: util={pct(gpu['util_ratio'])} power={gpu['power_w']} W "
            f"SM clock={gpu['sm_clock_mhz']} MHz xid={gpu['xid_last']}"
        )
    return lines


def _gateway(gw: Mapping[str, Any] | None) -> list[str]:
    """``gateway: HTTP 429 (RateLimited), 12.0 ms own time of 40.0 ms, routing 2.0 ms``;
    nothing when no gateway or HTTP outcome is known (or the document predates it)."""
    if not gw:
        return []
    via_gateway = gw.get("gateway_e2e_s") is not None or gw.get("routing_s") is not None
    if not via_gateway and gw.get("http_status") in (None, 200) and not gw.get("error_type"):
        return []  # a plain success seen only by the client: nothing to add
    parts = [f"HTTP {gw['http_status'] if gw['http_status'] is not None else '?'}"]
    if gw.get("error_type"):
        parts[0] += f" ({gw['error_type']})"
    if gw.get("gateway_s") is not None:
        parts.append(f"own time {fmt_s(gw['gateway_s'])} of {fmt_s(gw['gateway_e2e_s'])}")
    elif gw.get("gateway_e2e_s") is not None:
        parts.append(f"E2E {fmt_s(gw['gateway_e2e_s'])}")
    if gw.get("routing_s") is not None:
        parts.append(f"routing {fmt_s(gw['routing_s'])}")
    return [f"{'gateway' if via_gateway else 'outcome'}: {', '.join(parts)}", ""]


def _root_cause(root: Mapping[str, Any] | None) -> list[str]:
    """``root cause: <rule> on <replica>: <summary>``; nothing when there is none (or the
    document predates root causes)."""
    if not root:
        return []
    where = root["replica"] or "fleet"
    line = f"root cause: {root['rule']} on {where}: {root['summary']}"
    if root.get("explains"):
        return [line, f"  which explains {root['explains']}: {root['reason']}"]
    return [line]
