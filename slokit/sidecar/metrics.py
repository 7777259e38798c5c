"""The sidecar's own Prometheus metrics (names per docs/metrics.md, the public contract).

Everything lives in one injectable :class:`~prometheus_client.CollectorRegistry`, so tests
read the values of a sidecar they started without touching the process-global registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from slokit.store.usage import StoreUsage

SLI_LABELS = ("class", "replica", "model", "outcome")


class SidecarMetrics:
    """Every ``slokit_*`` series the sidecar exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        # -- SLI and cost ------------------------------------------------------------------
        self.requests = Counter(
            "slokit_requests_total", "Finished requests by SLO outcome.", SLI_LABELS, registry=r
        )
        self.output_tokens = Counter(
            "slokit_output_tokens_total", "Output tokens of finished requests by SLO outcome.",
            SLI_LABELS, registry=r,
        )  # fmt: skip
        self.requests_incomplete = Counter(
            "slokit_requests_incomplete_total",
            "Requests a load test cut at its end (status incomplete): not judged.", ["class"],
            registry=r,
        )  # fmt: skip
        self.gpu_cost = Counter(
            "slokit_gpu_cost_usd_total", "GPU cost accrued while the replica is up.",
            ["replica"], registry=r,
        )  # fmt: skip
        self.cost_per_good_request = Gauge(
            "slokit_cost_per_good_request_usd",
            "GPU cost / good requests over the trailing window.", ["class"], registry=r,
        )  # fmt: skip
        self.cost_per_successful_task = Gauge(
            "slokit_cost_per_successful_task_usd",
            "GPU cost / successful tasks over the trailing window.", registry=r,
        )  # fmt: skip
        self.findings_active = Gauge(
            "slokit_findings_active", "1 while a diagnostic finding is active.",
            ["rule", "replica", "severity"], registry=r,
        )  # fmt: skip
        self.slo_objective = Gauge(
            "slokit_slo_objective_ratio", "The class's SLO objective.", ["class"], registry=r
        )
        self.slo_bound = Gauge(
            "slokit_slo_bound_seconds", "The class's good_when bounds.", ["class", "bound"],
            registry=r,
        )  # fmt: skip
        self.label_values_folded = Counter(
            "slokit_label_values_folded_total",
            "Requests counted under label value 'other' (label budget).", ["label", "reason"],
            registry=r,
        )  # fmt: skip
        # -- health ------------------------------------------------------------------------
        self.scrape_up = Gauge(
            "slokit_scrape_up", "1 if the last scrape succeeded.", ["target", "kind", "replica"],
            registry=r,
        )  # fmt: skip
        self.scrape_duration = Gauge(
            "slokit_scrape_duration_seconds", "Duration of the last scrape.", ["target", "kind"],
            registry=r,
        )  # fmt: skip
        self.scrape_failures = Counter(
            "slokit_scrape_failures_total", "Scrapes dropped whole.",
            ["target", "kind", "reason"], registry=r,
        )  # fmt: skip
        self.counter_resets = Counter(
            "slokit_counter_resets_total", "Counter decreases seen (restarts).", ["target"],
            registry=r,
        )  # fmt: skip
        self.spans_received = Counter(
            "slokit_spans_received_total", "Spans decoded.", ["protocol"], registry=r
        )
        self.spans_rejected = Counter(
            "slokit_spans_rejected_total", "Spans rejected (partial_success).", ["reason"],
            registry=r,
        )  # fmt: skip
        self.spans_unjoined = Counter(
            "slokit_spans_unjoined_total",
            "Gateway spans without a request id that never joined a request by trace id "
            "(reason: expired, overflow, no_trace_id).", ["reason"], registry=r,
        )  # fmt: skip
        self.requests_pruned = Counter(
            "slokit_requests_pruned_total",
            "Requests deleted from the store by retention (retention_requests, retention_s).",
            registry=r,
        )
        self.requests_pruned_before_lake = Counter(
            "slokit_requests_pruned_before_lake",
            "Requests deleted past retention_requests + lake_hold_requests before the lake "
            "settled them; state: unwritten (their minute not in the lake) or revisited (in "
            "the lake as first written, without later changes).", ["state"], registry=r,
        )  # fmt: skip
        self.requests_whole_from = Gauge(
            "slokit_requests_whole_from_timestamp_seconds",
            "The store's requests are whole from this arrival on (epoch seconds): the newest "
            "that retention deleted; the diagnoses start no earlier. 0: none deleted.",
            registry=r,
        )
        self.rows_pruned = Counter(
            "slokit_rows_pruned_total",
            "Rows of the store's time series (samples, scrapes, findings) deleted by retention "
            "(retention_s).", ["table"], registry=r,
        )  # fmt: skip
        self.otlp_requests = Counter(
            "slokit_otlp_requests_total", "OTLP export requests by response code.",
            ["protocol", "code"], registry=r,
        )  # fmt: skip
        self.otlp_body_bytes_held = Gauge(
            "slokit_otlp_body_bytes_held",
            "Bytes of OTLP export bodies the receivers hold now (read or being read, decoded, "
            "waiting to be durable), bounded by otlp_body_budget_bytes.", registry=r,
        )  # fmt: skip
        self.otlp_body_budget = Gauge(
            "slokit_otlp_body_budget_bytes",
            "The bound on the bytes of OTLP export bodies held at once (otlp_body_budget_bytes).",
            registry=r,
        )  # fmt: skip
        self.queue_depth = Gauge(
            "slokit_write_queue_depth", "Items waiting for the writer.", registry=r
        )
        self.queue_capacity = Gauge(
            "slokit_write_queue_capacity", "Bound of the write queue.", registry=r
        )
        self.dropped = Counter(
            "slokit_dropped_total", "Items refused or dropped.", ["reason"], registry=r
        )
        self.ingest_lag = Gauge(
            "slokit_ingest_lag_seconds", "Age of the oldest item waiting for the writer.",
            registry=r,
        )  # fmt: skip
        self.db_memory = Gauge(
            "slokit_db_memory_bytes",
            "DuckDB's memory by tag (duckdb_memory()): what counts against db_memory_limit.",
            ["tag"], registry=r,
        )  # fmt: skip
        self.db_memory_limit = Gauge(
            "slokit_db_memory_limit_bytes", "DuckDB's memory limit (db_memory_limit).", registry=r
        )
        self.db_temp_storage = Gauge(
            "slokit_db_temp_storage_bytes",
            "What DuckDB spilled to temporary files past its memory limit.", registry=r,
        )  # fmt: skip
        self.arrow_allocated = Gauge(
            "slokit_arrow_allocated_bytes",
            "What Arrow's memory pool holds for live buffers (journal batches, appends).",
            registry=r,
        )
        import pyarrow as pa  # loaded already in a sidecar (its writer appends Arrow tables)

        # read at each scrape: one call into Arrow, outside DuckDB's count
        self.arrow_allocated.set_function(pa.total_allocated_bytes)
        self.db_file = Gauge(
            "slokit_db_file_bytes", "The store's file: blocks used and free, and its WAL.",
            ["part"], registry=r,
        )  # fmt: skip
        self.commit_seconds = Histogram(
            "slokit_writer_commit_seconds", "Time per writer transaction.", registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )  # fmt: skip
        self.write_refused = Counter(
            "slokit_write_refused_total",
            "Records the store refused on their own (the rest of their batch was committed).",
            ["kind"], registry=r,
        )  # fmt: skip
        self.sample_values_invalid = Counter(
            "slokit_sample_values_invalid_total",
            "Scraped values out of their field's range, stored as missing.", ["kind", "field"],
            registry=r,
        )  # fmt: skip
        self.wal_quarantined = Counter(
            "slokit_wal_quarantined_total", "Torn/corrupt WAL files set aside at start.",
            registry=r,
        )  # fmt: skip
        self.wal_damaged = Counter(
            "slokit_wal_damaged_total",
            "WALs found damaged at start whose intact part was replayed (kind: torn_tail, "
            "discarded).", ["kind"], registry=r,
        )  # fmt: skip

    def set_store_usage(self, usage: StoreUsage) -> None:
        """Export one reading of the store's memory and file (slokit.store.usage)."""
        for tag, n in usage.memory_by_tag.items():
            self.db_memory.labels(tag=tag).set(n)
        if usage.memory_limit_bytes is not None:
            self.db_memory_limit.set(usage.memory_limit_bytes)
        self.db_temp_storage.set(usage.temp_storage_bytes)
        self.db_file.labels(part="used").set(usage.file_used_bytes)
        self.db_file.labels(part="free").set(usage.file_free_bytes)
        self.db_file.labels(part="wal").set(usage.wal_bytes)
