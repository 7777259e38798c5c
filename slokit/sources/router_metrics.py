"""Gateway router ``/metrics`` exposition -> :class:`RouterSample` per (InferencePool, model).

The router is the llm-d router / Gateway API Inference Extension endpoint picker (EPP). Its
metrics moved to the ``llm_d_epp_*`` prefix; the older ``inference_objective_*``,
``inference_pool_*`` and ``inference_extension_*`` names are still emitted beside them as
deprecated aliases (and ``inference_model_*`` is what releases before the
InferenceObjective rename wrote). Each field lists its names, current first: the first one
present in the scrape is read, the others are fallbacks, so a scrape with both is not counted
twice. Names, types and label sets are checked against:

* ``llm-d/llm-d-router`` ``docs/metrics.md`` and ``pkg/epp/metrics/llm_d_router_metrics.go``
  (the ``llm_d_epp`` subsystem), ``pkg/epp/metrics/metrics.go`` (the deprecated twins, still
  registered) and ``pkg/epp/metrics/collectors/inference_pool.go``;
* ``kubernetes-sigs/gateway-api-inference-extension`` ``site-src/guides/metrics-and-observability.md``
  and ``pkg/epp/metrics/metrics.go`` (``inference_objective_*``, ``inference_pool_*``,
  ``inference_extension_flow_control_*``) and the older ``site-src/guides/metrics.md``
  (``inference_model_*``).

Pool-level gauges are labelled ``name`` (pool averages) or ``inference_pool`` (flow control);
request series are labelled ``model_name`` (summed over ``target_model_name``, ``fairness_id``,
``priority``, ``streaming``). Request series carry no pool label: an EPP serves one pool, so
they take the pool the scrape names when it names exactly one. A value outside its range
(NaN, +-Inf, negative, a count past 2**53) becomes a missing fact and is counted in ``invalid``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from slokit.records import HistogramSnapshot, RouterSample
from slokit.sources.exposition import MetricFamily, Sample, parse_exposition
from slokit.sources.validate import MAX_RATIO, Invalid, is_count, sample_value

# -- pool gauges, labelled ``name`` (the InferencePool) ------------------------------------
#: RouterSample field -> gauge names, current first.
POOL_GAUGES: dict[str, tuple[str, ...]] = {
    # llm-d-router llm_d_router_metrics.go "average_kv_cache_utilization" {name};
    # deprecated twin in metrics.go / GIE metrics.go (inference_pool subsystem).
    "avg_kv_usage_ratio": (
        "llm_d_epp_average_kv_cache_utilization",
        "inference_pool_average_kv_cache_utilization",
    ),
    # llm_d_router_metrics.go "average_queue_size" {name}; GIE metrics.go inference_pool.
    "avg_queue_size": ("llm_d_epp_average_queue_size", "inference_pool_average_queue_size"),
    # llm_d_router_metrics.go "average_running_requests" {name}; llm-d-router metrics.go.
    "avg_running": (
        "llm_d_epp_average_running_requests",
        "inference_pool_average_running_requests",
    ),
    # llm_d_router_metrics.go "ready_endpoints" {name}; GIE metrics.go "ready_pods".
    "ready_endpoints": ("llm_d_epp_ready_endpoints", "inference_pool_ready_pods"),
}
#: The pool label of POOL_GAUGES (llm-d-router docs/metrics.md "Inference pool").
POOL_LABEL = "name"

# -- flow control, labelled ``inference_pool`` ---------------------------------------------
#: Gauge {inference_pool, stage}: llm_d_router_metrics.go "flow_control_pool_saturation";
#: the deprecated inference_extension twin (llm-d-router metrics.go) has the same labels,
#: GIE's older one no ``stage``. Stage ``effective`` (max of prefill, decode) gates dispatch.
POOL_SATURATION: tuple[str, ...] = (
    "llm_d_epp_flow_control_pool_saturation",
    "inference_extension_flow_control_pool_saturation",
)
#: Gauges {fairness_id, priority, inference_pool, model_name, target_model_name}, summed per
#: (pool, model): llm_d_router_metrics.go "flow_control_queue_size" / "_queue_bytes";
#: deprecated inference_extension twins in llm-d-router metrics.go and GIE
#: site-src/guides/metrics-and-observability.md.
FLOW_QUEUE: dict[str, tuple[str, ...]] = {
    "flow_queue_size": (
        "llm_d_epp_flow_control_queue_size",
        "inference_extension_flow_control_queue_size",
    ),
    "flow_queue_bytes": (
        "llm_d_epp_flow_control_queue_bytes",
        "inference_extension_flow_control_queue_bytes",
    ),
}
#: Counter {outcome, priority, inference_pool}: llm_d_router_metrics.go
#: "flow_control_requests_total" (no deprecated twin).
FLOW_OUTCOMES: tuple[str, ...] = ("llm_d_epp_flow_control_requests_total",)
FLOW_POOL_LABEL = "inference_pool"

# -- request series, labelled ``model_name`` -------------------------------------------------
#: Counters (sample names with ``_total``): llm_d_router_metrics.go "request_total"
#: {model_name, target_model_name, fairness_id, priority}; llm-d-router metrics.go
#: inference_objective twin {model_name, target_model_name, priority}; GIE
#: site-src/guides/metrics.md (before the InferenceObjective rename) inference_model_*.
REQUESTS: tuple[str, ...] = (
    "llm_d_epp_request_total",
    "inference_objective_request_total",
    "inference_model_request_total",
)
#: Counters by ``error_code`` (llm-d-router pkg/common/error/error.go: BadRequest, NotFound,
#: Internal, ServiceUnavailable, ModelServerError, ResourceExhausted...):
#: llm_d_router_metrics.go "request_error_total"; metrics.go and GIE inference_objective;
#: GIE site-src/guides/metrics.md inference_model.
ERRORS: tuple[str, ...] = (
    "llm_d_epp_request_error_total",
    "inference_objective_request_error_total",
    "inference_model_request_error_total",
)
#: Gauge: llm_d_router_metrics.go "request_running"; GIE metrics.go
#: "inference_objective_running_requests" {model_name}.
RUNNING: tuple[str, ...] = ("llm_d_epp_request_running", "inference_objective_running_requests")
MODEL_LABEL = "model_name"

#: Histogram key -> family names, current first.
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    # llm_d_router_metrics.go "request_ttft_seconds" {+ streaming} (current only).
    "ttft_s": ("llm_d_epp_request_ttft_seconds",),
    # llm_d_router_metrics.go "request_streaming_tpot_seconds" (current only).
    "tpot_s": ("llm_d_epp_request_streaming_tpot_seconds",),
    # llm_d_router_metrics.go "request_duration_seconds"; metrics.go / GIE inference_objective;
    # GIE site-src/guides/metrics.md inference_model.
    "e2e_s": (
        "llm_d_epp_request_duration_seconds",
        "inference_objective_request_duration_seconds",
        "inference_model_request_duration_seconds",
    ),
    # Time in flow control from enqueue to outcome {fairness_id, priority, outcome,
    # inference_pool, model_name, target_model_name}: llm_d_router_metrics.go
    # "flow_control_request_queue_duration_seconds"; inference_extension twin (GIE docs).
    "flow_queue_s": (
        "llm_d_epp_flow_control_request_queue_duration_seconds",
        "inference_extension_flow_control_request_queue_duration_seconds",
    ),
}

#: Families of the router's exposition that are known and deliberately not read (sizes, token
#: counts, scheduler and plugin latencies, build info, per-endpoint queues: what the engines
#: already say, or not about queueing). Listed so that a fixture's names are all accounted for.
IGNORED: frozenset[str] = frozenset(
    {
        "llm_d_epp_request_size_bytes",
        "llm_d_epp_response_size_bytes",
        "llm_d_epp_request_input_tokens",
        "llm_d_epp_request_output_tokens",
        "llm_d_epp_request_cached_tokens",
        "llm_d_epp_request_ntpot_seconds",
        "llm_d_epp_request_streaming_itl_seconds",
        "llm_d_epp_std_dev_kv_cache_utilization",
        "llm_d_epp_std_dev_queue_size",
        "llm_d_epp_std_dev_running_requests",
        "llm_d_epp_per_endpoint_queue_size",
        "llm_d_epp_scheduler_e2e_duration_seconds",
        "llm_d_epp_scheduler_attempts",
        "llm_d_epp_info",
        "llm_d_epp_flow_control_dispatch_cycle_duration_seconds",
        "llm_d_epp_flow_control_request_enqueue_duration_seconds",
        "llm_d_epp_flow_control_stale_endpoints",
        "inference_objective_request_sizes",
        "inference_objective_response_sizes",
        "inference_objective_input_tokens",
        "inference_objective_output_tokens",
        "inference_objective_normalized_time_per_output_token_seconds",
        "inference_pool_per_pod_queue_size",
        "inference_extension_scheduler_e2e_duration_seconds",
        "inference_extension_info",
        "inference_model_request_sizes",
        "inference_model_response_sizes",
        "inference_model_input_tokens",
        "inference_model_output_tokens",
    }
)

#: Field -> (lo, hi): a value outside is a missing fact. Saturation is not clamped by the
#: router (above 1.0 is oversubscription), so it is only kept finite and non-negative.
ROUTER_RANGES: dict[str, tuple[float, float]] = {"avg_kv_usage_ratio": (0.0, MAX_RATIO)}

_Key = tuple[str | None, str | None]  # (pool, model)


def _strip_total(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def known_families() -> frozenset[str]:
    """Every family name (counters without ``_total``) this module reads or knowingly skips."""
    read: set[str] = set(POOL_SATURATION) | set(FLOW_OUTCOMES) | set(REQUESTS) | set(ERRORS)
    read |= set(RUNNING)
    for table in (POOL_GAUGES, FLOW_QUEUE, HISTOGRAMS):
        for names in table.values():
            read |= set(names)
    return frozenset(_strip_total(n) for n in read) | IGNORED


def is_router_exposition(families: Iterable[MetricFamily]) -> bool:
    """True when a family is one the router alone writes (``llm_d_epp_*``, ``inference_pool_*``,
    ``inference_objective_*``, ``inference_extension_*``, ``inference_model_*``)."""
    known = known_families()
    return any(_strip_total(f.name) in known for f in families)


def parse_router_metrics(
    data: str | bytes, *, ts: float, router: str, invalid: Invalid = None
) -> list[RouterSample]:
    """Parse one router scrape. Raises :class:`~slokit.errors.BadInput` if it is malformed."""
    return router_samples_from_families(
        parse_exposition(data), ts=ts, router=router, invalid=invalid
    )


@dataclass
class _Builder:
    ts: float
    router: str
    invalid: Invalid
    only_pool: str | None
    samples: dict[_Key, RouterSample]

    def get(self, pool: str | None, model: str | None) -> RouterSample:
        key = (pool if pool is not None else self.only_pool, model)
        rs = self.samples.get(key)
        if rs is None:
            rs = self.samples[key] = RouterSample(
                ts=self.ts, router=self.router, pool=key[0], model=model
            )
        return rs

    def value(self, s: Sample, fieldname: str) -> float | None:
        return sample_value(s.value, fieldname, ROUTER_RANGES, self.invalid)


def router_samples_from_families(
    families: Iterable[MetricFamily], *, ts: float, router: str, invalid: Invalid = None
) -> list[RouterSample]:
    """Build router samples from already-parsed families (one scrape)."""
    by_name: dict[str, list[Sample]] = {}
    for fam in families:
        for s in fam.samples:
            by_name.setdefault(s.name, []).append(s)
    b = _Builder(ts, router, invalid, _only_pool(by_name), {})

    for fieldname, names in POOL_GAUGES.items():
        for s in _first_present(by_name, names):
            setattr(b.get(s.labels.get(POOL_LABEL), None), fieldname, b.value(s, fieldname))

    by_stage: dict[str | None, dict[str, float | None]] = {}
    for s in _first_present(by_name, POOL_SATURATION):
        stages = by_stage.setdefault(s.labels.get(FLOW_POOL_LABEL), {})
        stages[s.labels.get("stage") or ""] = b.value(s, "pool_saturation")
    for pool, stages in by_stage.items():
        b.get(pool, None).pool_saturation = _gating(stages)

    for fieldname, names in FLOW_QUEUE.items():
        _sum_into(b, _first_present(by_name, names), fieldname, pool_label=FLOW_POOL_LABEL)
    for s in _first_present(by_name, FLOW_OUTCOMES):
        rs = b.get(s.labels.get(FLOW_POOL_LABEL), None)
        v = b.value(s, "flow_outcomes")
        if v is not None:
            outcome = s.labels.get("outcome", "unknown")
            rs.flow_outcomes[outcome] = rs.flow_outcomes.get(outcome, 0.0) + v

    _sum_into(b, _first_present(by_name, REQUESTS), "requests_total")
    _sum_into(b, _first_present(by_name, RUNNING), "running")
    for s in _first_present(by_name, ERRORS):
        rs = b.get(None, s.labels.get(MODEL_LABEL))
        v = b.value(s, "errors_total")
        if v is None:
            continue
        code = s.labels.get("error_code", "Unknown")
        rs.errors_by_code[code] = rs.errors_by_code.get(code, 0.0) + v
        rs.errors_total = (rs.errors_total or 0.0) + v

    for key, names in HISTOGRAMS.items():
        for fam_name in names:
            merged = _histograms(by_name, fam_name, key, invalid)
            if merged:
                for (pool, model), snap in merged.items():
                    b.get(pool, model).histograms[key] = snap
                break
    return list(b.samples.values())


def _gating(stages: dict[str, float | None]) -> float | None:
    """The value flow control gates on: stage ``effective``; an older router's stage-less
    series; else the most saturated stage."""
    for stage in ("effective", ""):
        if stage in stages:
            return stages[stage]
    known = [v for v in stages.values() if v is not None]
    return max(known) if known else None


def _only_pool(by_name: dict[str, list[Sample]]) -> str | None:
    """The scrape's pool when it names exactly one (an EPP serves one InferencePool)."""
    pools: set[str] = set()
    for names in (*POOL_GAUGES.values(), POOL_SATURATION, *FLOW_QUEUE.values()):
        for s in _first_present(by_name, names):
            p = s.labels.get(POOL_LABEL) or s.labels.get(FLOW_POOL_LABEL)
            if p:
                pools.add(p)
    return next(iter(pools)) if len(pools) == 1 else None


def _sum_into(
    b: _Builder, samples: list[Sample], fieldname: str, *, pool_label: str | None = None
) -> None:
    """Sum a per-model series over its other labels; one bad value leaves the sum unknown."""
    unknown: set[_Key] = set()
    for s in samples:
        rs = b.get(s.labels.get(pool_label) if pool_label else None, s.labels.get(MODEL_LABEL))
        key = (rs.pool, rs.model)
        v = b.value(s, fieldname)
        if v is None:
            unknown.add(key)
            continue
        setattr(rs, fieldname, (getattr(rs, fieldname) or 0.0) + v)
    for key in unknown:
        setattr(b.samples[key], fieldname, None)


def _first_present(by_name: dict[str, list[Sample]], names: tuple[str, ...]) -> list[Sample]:
    for n in names:
        if n in by_name:
            return by_name[n]
    return []


def _histograms(
    by_name: dict[str, list[Sample]], fam: str, key: str, invalid: Invalid
) -> dict[_Key, HistogramSnapshot]:
    """One histogram per (pool, model), summed over the other labels (same bucket bounds;
    a label set with other bounds, no +Inf, or a value that is no count is left out)."""
    series: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    bounds: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for s in by_name.get(fam + "_bucket", []):
        labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        try:
            le = float(s.labels.get("le", "nan"))
        except ValueError:
            continue
        if not math.isnan(le):
            bounds.setdefault(labels, []).append((le, s.value))
    for suffix in ("_sum", "_count"):
        for s in by_name.get(fam + suffix, []):
            series.setdefault(tuple(sorted(s.labels.items())), {})[suffix] = s.value
    out: dict[_Key, HistogramSnapshot] = {}
    for labels, pairs in bounds.items():
        pairs.sort()
        extra = series.get(labels, {})
        if pairs[-1][0] != math.inf or "_sum" not in extra or "_count" not in extra:
            continue
        if not (is_count(extra["_count"]) and all(is_count(c) for _, c in pairs)):
            if invalid is not None:
                invalid[f"histogram:{key}"] += 1
            continue
        d = dict(labels)
        k = (d.get(FLOW_POOL_LABEL), d.get(MODEL_LABEL))
        snap = out.get(k)
        if snap is None:
            out[k] = HistogramSnapshot(
                metric=key,
                upper_bounds=[p[0] for p in pairs],
                cumulative_counts=[p[1] for p in pairs],
                sum=extra["_sum"],
                count=extra["_count"],
            )
        elif snap.upper_bounds == [p[0] for p in pairs]:
            snap.cumulative_counts = [
                a + p[1] for a, p in zip(snap.cumulative_counts, pairs, strict=True)
            ]
            snap.sum += extra["_sum"]
            snap.count += extra["_count"]
    return out
