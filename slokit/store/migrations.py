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

#: A column's storage without compression (see migration 8).
_UNCOMPRESSED = "USING COMPRESSION uncompressed"

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
    Migration(
        2,
        "requests keyed by request_id",
        # The primary key replaces the plain index: a commit appends the rows of new requests
        # and learns from the key which requests already had a row (see slokit.store.append).
        # DuckDB cannot swap an index for a key in one transaction: the table is rebuilt.
        f"""
CREATE TABLE requests_keyed (
    request_id VARCHAR PRIMARY KEY,
    {_REQUEST_COLUMNS},
    sources VARCHAR[] NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
INSERT INTO requests_keyed SELECT DISTINCT ON (request_id) * FROM requests;
DROP TABLE requests;
ALTER TABLE requests_keyed RENAME TO requests;
""",
    ),
    Migration(
        3,
        "histograms in the engine sample's row",
        # One insert per scrape instead of two; histogram_samples stays readable as a view.
        """
ALTER TABLE engine_samples ADD COLUMN histograms STRUCT(
    metric VARCHAR, upper_bounds DOUBLE[], cumulative_counts DOUBLE[], sum DOUBLE, count DOUBLE
)[];
CREATE TEMPORARY TABLE _histograms AS
SELECT ts, replica, model,
       list_sort(list_distinct(list({'metric': metric, 'upper_bounds': upper_bounds,
           'cumulative_counts': cumulative_counts, 'sum': sum, 'count': count}))) AS hs
FROM histogram_samples
GROUP BY ts, replica, model;
UPDATE engine_samples AS e SET histograms = h.hs FROM _histograms AS h
WHERE e.ts = h.ts AND e.replica = h.replica AND e.model = h.model;
INSERT INTO engine_samples (ts, replica, model, histograms)
SELECT h.ts, h.replica, h.model, h.hs FROM _histograms AS h
WHERE NOT EXISTS (
    SELECT 1 FROM engine_samples AS e
    WHERE e.ts = h.ts AND e.replica = h.replica AND e.model = h.model
);
DROP TABLE _histograms;
DROP TABLE histogram_samples;
CREATE VIEW histogram_samples AS
SELECT ts, replica, model, h.metric AS metric, h.upper_bounds AS upper_bounds,
       h.cumulative_counts AS cumulative_counts, h.sum AS sum, h.count AS count
FROM (SELECT ts, replica, model, unnest(histograms) AS h FROM engine_samples);
""",
    ),
    Migration(
        4,
        "engine samples: waiting by reason, prompt tokens by source",
        # vLLM's num_requests_waiting_by_reason{reason} and prompt_tokens_by_source{source},
        # kept per label value as request_success_by_reason is.
        """
ALTER TABLE engine_samples ADD COLUMN waiting_by_reason MAP(VARCHAR, DOUBLE);
ALTER TABLE engine_samples ADD COLUMN prompt_tokens_by_source MAP(VARCHAR, DOUBLE);
""",
    ),
    Migration(
        5,
        "gateway spans joined by trace id",
        # A gateway span that names no request id waits in pending_trace_fragments (the
        # columns of request_fragments) until a fragment of its trace arrives, bounded in age
        # and count (slokit.store._trace_join); those that never join are counted by reason in
        # unjoined_spans. gateway_routing_s (the router's scheduling span) stays a fragment
        # fact: requests does not change. The trace id index finds a trace's request.
        """
ALTER TABLE request_fragments ADD COLUMN gateway_routing_s DOUBLE;
CREATE INDEX request_fragments_trace_id ON request_fragments (trace_id);
CREATE TABLE pending_trace_fragments AS SELECT * FROM request_fragments WHERE false;
CREATE TABLE unjoined_spans (
    ts TIMESTAMPTZ NOT NULL,
    reason VARCHAR NOT NULL,
    count BIGINT NOT NULL
);
""",
    ),
    Migration(
        6,
        "router samples",
        # The gateway router's state per scrape (slokit.sources.router_metrics): one row per
        # (router, pool, model); model NULL holds the pool's own gauges. Counters are raw
        # cumulative values, histograms in the row as engine_samples keeps them.
        """
CREATE TABLE router_samples (
    ts TIMESTAMPTZ NOT NULL,
    router VARCHAR NOT NULL,
    pool VARCHAR,
    model VARCHAR,
    flow_queue_size DOUBLE,
    flow_queue_bytes DOUBLE,
    pool_saturation DOUBLE,
    avg_kv_usage_ratio DOUBLE,
    avg_queue_size DOUBLE,
    avg_running DOUBLE,
    ready_endpoints DOUBLE,
    running DOUBLE,
    requests_total DOUBLE,
    errors_total DOUBLE,
    errors_by_code MAP(VARCHAR, DOUBLE),
    flow_outcomes MAP(VARCHAR, DOUBLE),
    histograms STRUCT(
        metric VARCHAR, upper_bounds DOUBLE[], cumulative_counts DOUBLE[], sum DOUBLE,
        count DOUBLE
    )[]
);
""",
    ),
    Migration(
        7,
        "requests: when each was first seen",
        # first_ingested_at: the earliest ingested_at of the request's fragments, kept by the
        # merge (order-independent: a minimum). The sidecar's SLI tick counts the requests first
        # seen since its last tick from it, through the zone maps of the newest row groups,
        # instead of joining every recent fragment (a cost that grew with the file's age).
        """
ALTER TABLE requests ADD COLUMN first_ingested_at TIMESTAMPTZ;
UPDATE requests SET first_ingested_at = f.first_ingested_at
FROM (SELECT request_id, min(ingested_at) AS first_ingested_at
      FROM request_fragments GROUP BY request_id) AS f
WHERE requests.request_id = f.request_id;
""",
    ),
    Migration(
        8,
        "request tables: indexed ids stored uncompressed",
        # DuckDB takes a deleted row's keys out of its indexes at commit by fetching them one
        # row at a time, and fetching one string from a DICT_FSST segment (its default for
        # strings) costs about 8 µs: a pruned request cost 37 µs at commit, 5 µs with its ids
        # uncompressed (slokit.store.retention). Random ids hardly compress anyway. Only the
        # indexed columns change; DuckDB sets a column's compression when the table is
        # created, so both tables are rebuilt.
        f"""
CREATE TABLE request_fragments_v8 (
    fragment_id VARCHAR {_UNCOMPRESSED} PRIMARY KEY,
    request_id VARCHAR {_UNCOMPRESSED} NOT NULL,
    source VARCHAR NOT NULL,
    ingested_at TIMESTAMPTZ NOT NULL,
    {_REQUEST_COLUMNS.replace("trace_id VARCHAR,", f"trace_id VARCHAR {_UNCOMPRESSED},", 1)},
    gateway_routing_s DOUBLE
);
INSERT INTO request_fragments_v8 SELECT * FROM request_fragments;
DROP TABLE request_fragments;
ALTER TABLE request_fragments_v8 RENAME TO request_fragments;
CREATE INDEX request_fragments_request_id ON request_fragments (request_id);
CREATE INDEX request_fragments_trace_id ON request_fragments (trace_id);
CREATE TABLE requests_v8 (
    request_id VARCHAR {_UNCOMPRESSED} PRIMARY KEY,
    {_REQUEST_COLUMNS},
    sources VARCHAR[] NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    first_ingested_at TIMESTAMPTZ
);
INSERT INTO requests_v8 SELECT * FROM requests;
DROP TABLE requests;
ALTER TABLE requests_v8 RENAME TO requests;
""",
    ),
    Migration(
        9,
        "request_fragments: the trace-id index built when first used",
        # Only fragments that join their request by trace id (a gateway span without a request
        # id) look fragments up by trace id. A store that never receives one no longer keeps
        # the index up to date (about a tenth of an append's cost); the trace join builds it
        # the first time it needs it (slokit.store._trace_join.ensure_trace_index).
        "DROP INDEX IF EXISTS request_fragments_trace_id;",
    ),
    Migration(
        10,
        "request_fragments: a fragment is one per request and fragment id, no primary key",
        # The primary key on fragment_id was the costliest index of a store: about a quarter
        # of what appending a vLLM span cost, 47 bytes of memory per stored fragment. A
        # fragment sent again is found among its request's stored fragments (the request id
        # index), so the key only kept a fragment id from being stored under a second request
        # id (first come, first kept: an order the merge must not depend on). Such a fragment
        # is now a fragment of each request it names. The ids stay uncompressed where indexed
        # (request_id; trace_id once the trace join builds its index).
        f"""
CREATE TABLE request_fragments_v10 (
    fragment_id VARCHAR NOT NULL,
    request_id VARCHAR {_UNCOMPRESSED} NOT NULL,
    source VARCHAR NOT NULL,
    ingested_at TIMESTAMPTZ NOT NULL,
    {_REQUEST_COLUMNS.replace("trace_id VARCHAR,", f"trace_id VARCHAR {_UNCOMPRESSED},", 1)},
    gateway_routing_s DOUBLE
);
INSERT INTO request_fragments_v10 SELECT * FROM request_fragments;
DROP TABLE request_fragments;
ALTER TABLE request_fragments_v10 RENAME TO request_fragments;
CREATE INDEX request_fragments_request_id ON request_fragments (request_id);
""",
    ),
    Migration(
        11,
        "store marks",
        # What the store knows of itself that its rows cannot say once deleted: by name, a
        # time. ``requests_whole_from`` (slokit.store.retention): the requests kept are whole
        # from this arrival on, retention having deleted older ones (the engine and GPU
        # samples go back further). Written in the transaction that deletes them, so a
        # sidecar restarted on the file, or ``slokit diagnose --db`` of a stopped one's, reads
        # what the running sidecar knew.
        """
CREATE TABLE store_marks (
    name VARCHAR PRIMARY KEY,
    ts TIMESTAMPTZ NOT NULL
);
""",
    ),
)

#: Columns of ``requests`` that are the local store's bookkeeping (the SLI's, schema 7): the
#: Parquet export, the readers' frames and the request records leave them out.
LOCAL_REQUEST_COLUMNS: tuple[str, ...] = ("first_ingested_at",)

#: The newest schema this code knows; a file with a newer one is refused, not guessed at.
LATEST_VERSION = max(m.version for m in MIGRATIONS)
