"""The typed explanation of one request and its JSON form (docs/schema/explain.schema.json).

Every part is a frozen dataclass whose ``to_dict`` writes the keys in the documented order,
so ``Explanation.to_dict()`` is the document ``slokit explain --json`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from slokit.analysis.explain._model_context import Context

#: What carries most of a request's latency (``preemption``: decode, stretched by preemption).
Dominant = Literal["queue", "prefill", "decode", "frontend", "preemption", "client", "unknown"]

#: The components of the latency, in the order the document and the text list them.
COMPONENTS: tuple[str, ...] = ("queue", "prefill", "decode", "frontend", "gateway", "client")


@dataclass(frozen=True)
class Components:
    """Where the time went. ``frontend_s`` is vLLM's E2E outside queue, prefill and decode
    (the API server: HTTP, tokenisation, detokenisation, streaming); ``client_s`` is what the
    client waited beyond the server's E2E (beyond the gateway's, when a gateway span says);
    ``gateway_s`` is the gateway's own time, its E2E beyond the engine's. None: not known
    from the data."""

    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    frontend_s: float | None
    client_s: float | None
    e2e_s: float | None
    client_e2e_s: float | None
    ttft_s: float | None
    client_ttft_s: float | None
    tpot_s: float | None
    gateway_s: float | None = None

    def seconds(self, name: str) -> float | None:
        """The component ``name`` (one of :data:`COMPONENTS`) in seconds."""
        value: float | None = getattr(self, f"{name}_s")
        return value

    def shares(self) -> dict[str, float | None]:
        """Each known component's share of the E2E (of the client's E2E when there is one)."""
        total = self.client_e2e_s if self.client_s is not None else self.e2e_s
        out: dict[str, float | None] = {}
        for name in COMPONENTS:
            part = self.seconds(name)
            if part is not None:
                out[name] = round(part / total, 4) if total else None
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "queue_s": self.queue_s,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "frontend_s": self.frontend_s,
            "other_s": self.frontend_s,  # the former name of frontend_s, kept as an alias
            "client_s": self.client_s,
            "gateway_s": self.gateway_s,
            "e2e_s": self.e2e_s,
            "client_e2e_s": self.client_e2e_s,
            "ttft_s": self.ttft_s,
            "client_ttft_s": self.client_ttft_s,
            "tpot_s": self.tpot_s,
            "shares": self.shares(),
        }


@dataclass(frozen=True)
class TimelineEvent:
    event: str
    t_s: float  # seconds after arrival
    ts: str | None  # ISO 8601 UTC

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class OverlappingFinding:
    """A stored finding whose window overlaps the request."""

    rule: str
    severity: str
    confidence: float
    replica: str | None
    summary: str
    runbook: str
    start: str | None
    end: str | None

    @property
    def actionable(self) -> bool:
        """Info-level findings (a telemetry gap, a mild drift) are context, not the cause."""
        return self.severity != "info"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class RootCause:
    """The root cause of the request's slowness: the active finding at the root of the
    causal chain (:mod:`slokit.analysis.causality`) that explains the finding behind the
    request's dominant component. ``explains`` and ``reason``: the finding it explains and
    how (None when the active finding is itself the root)."""

    id: str
    rule: str
    replica: str | None
    summary: str
    runbook: str
    explains: str | None
    reason: str | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class BoundCheck:
    bound: float
    value: float | None  # milliseconds
    ok: bool | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class SloJudgement:
    """The request judged by its SLO class; ``class_name`` None: it matches no class."""

    class_name: str | None
    outcome: str
    good: bool | None
    objective: float | None = None
    checks: Mapping[str, BoundCheck] = field(default_factory=dict)
    reason: str | None = None

    def to_dict(self) -> dict[str, object]:
        if self.class_name is None:
            return {"class": None, "outcome": self.outcome, "good": None, "reason": self.reason}
        return {
            "class": self.class_name,
            "objective": self.objective,
            "outcome": self.outcome,
            "good": self.good,
            "checks": {k: c.to_dict() for k, c in self.checks.items()},
        }


@dataclass(frozen=True)
class Tokens:
    prompt_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    max_tokens: int | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class GatewayView:
    """What the gateway saw: the HTTP status and error the caller got, the gateway's E2E,
    its own time (E2E beyond the engine's) and its routing decision (a router's scheduling
    span). None: not known from the data."""

    http_status: int | None
    error_type: str | None
    gateway_e2e_s: float | None
    gateway_s: float | None
    routing_s: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Explanation:
    """One request explained: where its time went, how it compares, and why."""

    request_id: str
    trace_id: str | None
    replica: str | None
    model: str | None
    slo_class: str | None
    status: str | None
    sources: tuple[str, ...]
    tokens: Tokens
    timeline: tuple[TimelineEvent, ...]
    components: Components
    dominant: Dominant
    cause: str
    context: Context
    findings: tuple[OverlappingFinding, ...]
    slo: SloJudgement | None
    runbook: str | None
    unknown: tuple[str, ...]
    root_cause: RootCause | None = None
    gateway: GatewayView | None = None

    def to_dict(self) -> dict[str, Any]:
        """The explain document (docs/schema/explain.schema.json): JSON values only."""
        return {
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "replica": self.replica,
            "model": self.model,
            "slo_class": self.slo_class,
            "status": self.status,
            "gateway": None if self.gateway is None else self.gateway.to_dict(),
            "sources": list(self.sources),
            "tokens": self.tokens.to_dict(),
            "timeline": [e.to_dict() for e in self.timeline],
            "components": self.components.to_dict(),
            "dominant": self.dominant,
            "cause": self.cause,
            "root_cause": None if self.root_cause is None else self.root_cause.to_dict(),
            "context": self.context.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "slo": None if self.slo is None else self.slo.to_dict(),
            "runbook": self.runbook,
            "unknown": list(self.unknown),
        }
