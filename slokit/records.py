"""The record types that flow from sources to the store.

Units are in the field names: ``*_ts`` are Unix epoch seconds (UTC) as float,
``*_s`` are durations in seconds, ``*_ratio`` are 0..1, ``*_mib`` mebibytes, ``*_w`` watts.
Missing facts are ``None``, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

FragmentSource = Literal["vllm", "gateway", "client", "quality"]
Severity = Literal["info", "warning", "critical"]
#: ``incomplete``: still in flight when a load test ended (cut at its phase end, GuideLLM's
#: ``incomplete``, AIPerf's ``was_cancelled``); neither a success nor a failure of the server.
RequestStatus = Literal["ok", "error", "cancelled", "timeout", "rejected", "incomplete"]

#: Request statuses that count as failures (``cancelled`` is the client's choice,
#: ``incomplete`` the load test's end).
ERROR_STATUSES: tuple[RequestStatus, ...] = ("error", "timeout", "rejected")

#: Fragment sources in the order in which their facts are trusted by default.
SOURCE_PRECEDENCE: tuple[str, ...] = ("vllm", "gateway", "client", "quality")


class RequestFragment(NamedTuple):
    """One source's view of one request; fragments merge into a ``requests`` row.

    ``fragment_id`` makes re-ingest idempotent: the same span (or client record) seen twice
    has the same id and is stored once per request id it names.

    A tuple of its fields in :data:`FRAGMENT_FIELDS` order, immutable (``_replace`` makes a
    changed copy): the decoders build one per span, and a list of them is what Arrow converts
    to a table without reading the fields one by one.
    """

    request_id: str
    source: FragmentSource
    fragment_id: str
    trace_id: str | None = None
    replica: str | None = None
    model: str | None = None
    tenant: str | None = None
    slo_class: str | None = None
    task_id: str | None = None
    arrival_ts: float | None = None
    first_token_ts: float | None = None
    finish_ts: float | None = None
    client_ttft_s: float | None = None
    client_e2e_s: float | None = None
    ttft_s: float | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    inference_s: float | None = None
    e2e_s: float | None = None
    gateway_e2e_s: float | None = None
    tpot_s: float | None = None
    itl_p95_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    max_tokens: int | None = None
    preemptions: int | None = None
    finish_reason: str | None = None
    status: RequestStatus | None = None
    http_status: int | None = None
    error_type: str | None = None
    quality_pass: bool | None = None
    #: The router's routing decision time (its scheduling span, e.g. llm-d's
    #: ``pick_endpoints``): a fact of the gateway's fragment, not a column of ``requests``.
    gateway_routing_s: float | None = None


FRAGMENT_FIELDS: tuple[str, ...] = RequestFragment._fields


@dataclass(slots=True)
class HistogramSnapshot:
    """Cumulative histogram state of one metric at one scrape (Prometheus semantics)."""

    metric: str
    upper_bounds: list[float]
    cumulative_counts: list[float]
    sum: float
    count: float


@dataclass(slots=True)
class EngineSample:
    """The state of one vLLM engine (replica, model) at one scrape.

    Counters are raw cumulative values as exposed; rates are computed at query time with
    counter-reset handling (a decrease is a reset).
    """

    ts: float
    replica: str
    model: str
    engine: str | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage_ratio: float | None = None
    preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    request_success_total: float | None = None
    #: Counter by ``finished_reason`` (``stop``, ``length``, ``abort``, ``error``...): aborts kept.
    request_success_by_reason: dict[str, float] = field(default_factory=dict)
    #: Gauge ``num_requests_waiting_by_reason`` by ``reason`` (``capacity``: waiting for
    #: scheduling capacity; ``deferred``: held back by LoRA budget, KV transfer...).
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    #: Counter ``prompt_tokens_by_source`` by ``source`` (``local_compute``,
    #: ``local_cache_hit``, ``external_kv_transfer``).
    prompt_tokens_by_source: dict[str, float] = field(default_factory=dict)
    spec_decode_drafts_total: float | None = None
    spec_decode_draft_tokens_total: float | None = None
    spec_decode_accepted_tokens_total: float | None = None
    num_gpu_blocks: float | None = None
    block_size: float | None = None
    histograms: dict[str, HistogramSnapshot] = field(default_factory=dict)


@dataclass(slots=True)
class RouterSample:
    """The state of one gateway router (llm-d router / Gateway API Inference Extension endpoint
    picker) at one scrape, for one InferencePool and one model (``model`` None: the pool's own
    gauges). Counters are raw cumulative values, summed over the labels not kept here
    (``target_model_name``, ``fairness_id``, ``priority``); see
    :mod:`slokit.sources.router_metrics` for the metric names."""

    ts: float
    router: str
    pool: str | None = None
    model: str | None = None
    #: Requests held in the router's flow-control queue (summed over fairness and priority).
    flow_queue_size: float | None = None
    flow_queue_bytes: float | None = None
    #: The pool's saturation as flow control gates on it (stage ``effective``; 1.0 = set point).
    pool_saturation: float | None = None
    #: The pool's averages over its model servers, as the router sees them.
    avg_kv_usage_ratio: float | None = None
    avg_queue_size: float | None = None
    avg_running: float | None = None
    ready_endpoints: float | None = None
    #: Requests in flight through the router.
    running: float | None = None
    requests_total: float | None = None
    errors_total: float | None = None
    #: Counter ``request_error_total`` by ``error_code`` (``ResourceExhausted``...).
    errors_by_code: dict[str, float] = field(default_factory=dict)
    #: Counter ``flow_control_requests_total`` by ``outcome`` (``Dispatched``,
    #: ``RejectedCapacity``, ``EvictedTTL``...).
    flow_outcomes: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, HistogramSnapshot] = field(default_factory=dict)


@dataclass(slots=True)
class GpuSample:
    """One GPU at one instant, from dcgm-exporter or NVML."""

    ts: float
    node: str | None
    gpu: str
    uuid: str | None = None
    gpu_model: str | None = None
    replica: str | None = None
    namespace: str | None = None
    util_ratio: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    dram_active_ratio: float | None = None
    tensor_active_ratio: float | None = None
    gr_engine_active_ratio: float | None = None
    energy_j: float | None = None
    xid_last: float | None = None
    source: str = "dcgm"


@dataclass(slots=True)
class ScrapeResult:
    """Health of one scrape (or poll) of one target, kept so analysis knows when it is blind."""

    ts: float
    target: str
    kind: str  # "vllm" | "dcgm" | "nvml" | "file" | "prometheus"
    replica: str | None
    up: bool
    duration_s: float | None = None
    error: str | None = None
    samples: int = 0


@dataclass(slots=True)
class Finding:
    """One diagnostic conclusion: a rule fired for a replica (or the fleet) over a window."""

    rule: str
    severity: Severity
    confidence: float
    replica: str | None
    start_ts: float
    end_ts: float
    summary: str
    evidence: dict[str, Any]
    runbook: str
    #: Set by the diagnosis (:mod:`slokit.analysis.causality`): ``rule`` + ``@replica`` +
    #: ``#k`` (the k-th of the same rule and replica, k >= 2).
    id: str | None = None
    #: The findings that explain this one: ``{"id": ..., "reason": one sentence}``.
    caused_by: list[dict[str, str]] = field(default_factory=list)
    #: The ids of the findings this one explains.
    explains: list[str] = field(default_factory=list)
    #: The requests it affected: ``{"requests": n, "share": 0..1}``; None: not measurable.
    impact: dict[str, int | float] | None = None

    def to_json(self) -> dict[str, Any]:
        from slokit.timeutil import iso

        return {
            "rule": self.rule,
            "severity": self.severity,
            "confidence": round(self.confidence, 3),
            "replica": self.replica,
            "start": iso(self.start_ts),
            "end": iso(self.end_ts),
            "summary": self.summary,
            "evidence": self.evidence,
            "runbook": self.runbook,
            "id": self.id,
            "caused_by": [dict(c) for c in self.caused_by],
            "explains": list(self.explains),
            "impact": self.impact,
        }
