"""Where a request's time went: its components, its timeline, and the dominant component.

The decomposition follows vLLM's own timestamps (span attributes): queue (arrival to first
scheduled), prefill (scheduled to first token), decode (first to last token). What vLLM's
E2E holds beyond those is ``frontend``: the API server outside the engine (arrival to the
engine's queue, and output processing back: HTTP, tokenisation, detokenisation, streaming).
What a gateway span adds beyond vLLM's E2E is ``gateway`` (routing, proxying, its queue);
what the client waited beyond the server's E2E (the gateway's when known) is ``client``
(network, HTTP).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slokit.analysis.explain._model import Components, Dominant, GatewayView, TimelineEvent
from slokit.timeutil import iso

#: The components that can carry most of the latency, ties going to the first.
_CANDIDATES: tuple[Dominant, ...] = ("queue", "prefill", "decode", "frontend", "client")


def components(rec: Mapping[str, Any]) -> Components:
    """The request's time split into components (None where the data cannot tell)."""
    e2e: float | None = rec.get("e2e_s")
    queue: float | None = rec.get("queue_s")
    prefill: float | None = rec.get("prefill_s")
    decode: float | None = rec.get("decode_s")
    frontend = None
    # No vLLM split (no span): frontend is unknown too, never the whole E2E.
    if e2e is not None and queue is not None and prefill is not None and decode is not None:
        frontend = max(0.0, e2e - sum((queue, prefill, decode)))
    gateway_e2e: float | None = rec.get("gateway_e2e_s")
    gateway = None
    if gateway_e2e is not None and e2e is not None:
        gateway = max(0.0, gateway_e2e - e2e)
    client_e2e: float | None = rec.get("client_e2e_s")
    client = None
    server = gateway_e2e if gateway is not None else e2e
    if client_e2e is not None and server is not None:
        client = max(0.0, client_e2e - server)
    return Components(
        queue_s=queue,
        prefill_s=prefill,
        decode_s=decode,
        frontend_s=frontend,
        client_s=client,
        e2e_s=e2e,
        client_e2e_s=client_e2e,
        ttft_s=rec.get("ttft_s"),
        client_ttft_s=rec.get("client_ttft_s"),
        tpot_s=rec.get("tpot_s"),
        gateway_s=gateway,
    )


def gateway_view(rec: Mapping[str, Any], comps: Components) -> GatewayView | None:
    """The gateway's view of the request; None when no gateway span is part of it and no
    HTTP status or error is known."""
    view = GatewayView(
        http_status=rec.get("http_status"),
        error_type=rec.get("error_type"),
        gateway_e2e_s=rec.get("gateway_e2e_s"),
        gateway_s=comps.gateway_s,
        routing_s=rec.get("gateway_routing_s"),
    )
    known = view.http_status is not None or view.error_type is not None
    if "gateway" not in (rec.get("sources") or ()) and not known:
        return None
    return view


def timeline(rec: Mapping[str, Any]) -> tuple[TimelineEvent, ...]:
    """Arrival, scheduling, prefill done, first token, finish and client done, in order
    (empty when the arrival is unknown)."""
    arrival: float | None = rec.get("arrival_ts")
    if arrival is None:
        return ()
    events: list[tuple[str, float | None]] = [("arrival", 0.0)]
    queue: float | None = rec.get("queue_s")
    if queue is not None:
        events.append(("scheduled", queue))
        if rec.get("prefill_s") is not None:
            events.append(("prefill_done", queue + rec["prefill_s"]))
    events.append(("first_token", rec.get("ttft_s")))
    events.append(("finish", rec.get("e2e_s")))
    if rec.get("client_e2e_s") is not None:
        events.append(("client_done", rec["client_e2e_s"]))
    return tuple(
        TimelineEvent(name, round(t, 6), iso(arrival + t)) for name, t in events if t is not None
    )


def dominant(comps: Components, preempted: bool) -> Dominant:
    """The component that carries most of the latency; ``preemption`` when it is decode and
    the request was preempted; ``unknown`` when no component is known."""
    known = {name: v for name in _CANDIDATES if (v := comps.seconds(name)) is not None}
    if not known:
        return "unknown"
    top = max(known, key=lambda name: known[name])
    if top == "decode" and preempted:
        return "preemption"
    return top
