"""Versioned schema migrations: a registry of (version, name, SQL), applied in order, once.

Add a migration by appending to ``MIGRATIONS``; never edit one that has shipped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


_REQUEST_COLUMNS = """
    trace_id VARCHAR,
    replica VARCHAR,
    model VARCHAR,
    tenant VARCHAR,
    slo_class VARCHAR,
    task_id VARCHAR,
    arrival_ts TIMESTAMPTZ,
    first_token_ts TIMESTAMPTZ,
    finish_ts TIMESTAMPTZ,
    client_ttft_s DOUBLE,
    client_e2e_s DOUBLE,
    ttft_s DOUBLE,
    queue_s DOUBLE,
    prefill_s DOUBLE,
    decode_s DOUBLE,
    inference_s DOUBLE,
    e2e_s DOUBLE,
    gateway_e2e_s DOUBLE,
    tpot_s DOUBLE,
    itl_p95_s DOUBLE,
    prompt_tokens BIGINT,
    output_tokens BIGINT,
    cached_tokens BIGINT,
    max_tokens BIGINT,
    preemptions BIGINT,
    finish_reason VARCHAR,
    status VARCHAR,
    http_status INTEGER,
    error_type VARCHAR,
    quality_pass BOOLEAN
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "initial schema",
        f"""
CREATE TABLE request_fragments (
    fragment_id VARCHAR PRIMARY KEY,
    request_id VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    ingested_at TIMESTAMPTZ NOT NULL,
    {_REQUEST_COLUMNS}
);
CREATE INDEX request_fragments_request_id ON request_fragments (request_id);
CREATE TABLE requests (
    request_id VARCHAR NOT NULL,
    {_REQUEST_COLUMNS},
    sources VARCHAR[] NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX requests_request_id ON requests (request_id);
CREATE TABLE engine_samples (
    ts TIMESTAMPTZ NOT NULL,
    replica VARCHAR NOT NULL,
    model VARCHAR NOT NULL,
    engine VARCHAR,
    running DOUBLE,
    waiting DOUBLE,
    kv_usage_ratio DOUBLE,
    preemptions_total DOUBLE,
    prompt_tokens_total DOUBLE,
    generation_tokens_total DOUBLE,
    prefix_cache_queries_total DOUBLE,
    prefix_cache_hits_total DOUBLE,
    request_success_total DOUBLE,
    request_success_by_reason MAP(VARCHAR, DOUBLE),
    spec_decode_drafts_total DOUBLE,
    spec_decode_draft_tokens_total DOUBLE,
    spec_decode_accepted_tokens_total DOUBLE,
    num_gpu_blocks DOUBLE,
    block_size DOUBLE
);
CREATE TABLE histogram_samples (
    ts TIMESTAMPTZ NOT NULL,
    replica VARCHAR NOT NULL,
    model VARCHAR NOT NULL,
    metric VARCHAR NOT NULL,
    upper_bounds DOUBLE[] NOT NULL,
    cumulative_counts DOUBLE[] NOT NULL,
    sum DOUBLE,
    count DOUBLE
);
CREATE TABLE gpu_samples (
    ts TIMESTAMPTZ NOT NULL,
    node VARCHAR,
    gpu VARCHAR NOT NULL,
    uuid VARCHAR,
    gpu_model VARCHAR,
    replica VARCHAR,
    namespace VARCHAR,
    util_ratio DOUBLE,
    mem_used_mib DOUBLE,
    mem_total_mib DOUBLE,
    power_w DOUBLE,
    temperature_c DOUBLE,
    sm_clock_mhz DOUBLE,
    dram_active_ratio DOUBLE,
    tensor_active_ratio DOUBLE,
    gr_engine_active_ratio DOUBLE,
    energy_j DOUBLE,
    xid_last DOUBLE,
    source VARCHAR NOT NULL
);
CREATE TABLE scrapes (
    ts TIMESTAMPTZ NOT NULL,
    target VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    replica VARCHAR,
    up BOOLEAN NOT NULL,
    duration_s DOUBLE,
    error VARCHAR,
    samples INTEGER NOT NULL
);
CREATE TABLE findings (
    rule VARCHAR NOT NULL,
    severity VARCHAR NOT NULL,
    confidence DOUBLE NOT NULL,
    replica VARCHAR,
    start_ts TIMESTAMPTZ NOT NULL,
    end_ts TIMESTAMPTZ NOT NULL,
    summary VARCHAR NOT NULL,
    evidence JSON,
    runbook VARCHAR NOT NULL,
    created_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE ingest_rejections (
    ts TIMESTAMPTZ NOT NULL,
    source VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,
    count BIGINT NOT NULL,
    detail VARCHAR
);
""",
    ),
)
