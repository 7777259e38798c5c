"""``explain`` latency on a store holding 10 million requests, p50 and p95, in-process.

The store is generated synthetically with DuckDB SQL (10 M requests over ~11.6 hours from 8
replicas, with 1 s engine samples for each replica) and cached under ``.cache/bench/``. Each
explain runs the real library path (point lookup, peer percentile ranks, as-of engine state,
counter deltas, findings) for a random request id.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

from slokit.analysis.explain import explain_request
from slokit.store.db import open_store

N_REQUESTS = 10_000_000
REPLICAS = 8
T0 = 1_795_900_000.0
RATE = 240.0  # requests/s across the fleet -> ~11.6 h
SAMPLES = 300
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "bench"


def build(path: Path) -> None:
    store = open_store(path)
    con = store.con
    span_s = N_REQUESTS / RATE
    con.execute("BEGIN")
    con.execute(
        f"""
        INSERT INTO requests
        SELECT 'req-' || i AS request_id,
               md5(i::VARCHAR) AS trace_id,
               'pod-' || (i % {REPLICAS}) AS replica,
               'llama-7b' AS model, NULL AS tenant,
               CASE WHEN i % 5 = 0 THEN 'batch' ELSE 'interactive' END AS slo_class,
               'task-' || (i // 4) AS task_id,
               to_timestamp({T0} + i / {RATE}) AS arrival_ts,
               to_timestamp({T0} + i / {RATE} + 0.05 + (i % 97) / 500.0) AS first_token_ts,
               to_timestamp({T0} + i / {RATE} + 2.0 + (i % 89) / 50.0) AS finish_ts,
               0.06 + (i % 97) / 500.0 AS client_ttft_s, 2.1 + (i % 89) / 50.0 AS client_e2e_s,
               0.05 + (i % 97) / 500.0 AS ttft_s, (i % 97) / 1000.0 AS queue_s,
               0.05 + (i % 97) / 1000.0 AS prefill_s, 1.9 + (i % 89) / 50.0 AS decode_s,
               1.95 + (i % 89) / 50.0 AS inference_s, 2.0 + (i % 89) / 50.0 AS e2e_s,
               NULL AS gateway_e2e_s, 0.02 + (i % 13) / 1000.0 AS tpot_s, 0.03 AS itl_p95_s,
               200 + i % 1000 AS prompt_tokens, 100 + i % 300 AS output_tokens,
               NULL AS cached_tokens, 512 AS max_tokens, NULL AS preemptions,
               'length' AS finish_reason, 'ok' AS status, 200 AS http_status,
               NULL AS error_type, NULL AS quality_pass,
               ['client', 'vllm'] AS sources, now() AS updated_at
        FROM range({N_REQUESTS}) t(i)
        """
    )
    con.execute(
        f"""
        INSERT INTO engine_samples
            (ts, replica, model, engine, running, waiting, kv_usage_ratio, preemptions_total,
             prompt_tokens_total, generation_tokens_total, prefix_cache_queries_total,
             prefix_cache_hits_total, request_success_total, num_gpu_blocks, block_size)
        SELECT to_timestamp({T0} + s) AS ts, 'pod-' || r AS replica, 'llama-7b', '0',
               8 + (s % 7), s % 11, 0.5 + (s % 40) / 100.0, s // 50, s * 6000, s * 3000,
               s * 6000, s * 2000, s * 30, 4096, 16
        FROM range({int(span_s) + 60}) a(s), range({REPLICAS}) b(r)
        ORDER BY s, r
        """
    )
    con.execute("COMMIT")
    con.execute("CHECKPOINT")
    store.close()


def main(argv: list[str]) -> dict[str, float]:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"explain-{N_REQUESTS}.duckdb"
    if not path.exists():
        t = time.perf_counter()
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        build(tmp)
        tmp.rename(path)
        print(f"   built {N_REQUESTS:,} requests in {time.perf_counter() - t:.0f} s -> {path}")
    store = open_store(path, read_only=True)
    rng = random.Random(7)
    ids = [f"req-{rng.randrange(N_REQUESTS)}" for _ in range(SAMPLES)]
    reader = store.reader()
    explain_request(reader, ids[0])  # warm caches once
    times = []
    for rid in ids:
        t = time.perf_counter()
        doc = explain_request(reader, rid)
        times.append(time.perf_counter() - t)
        assert doc["request_id"] == rid
    times.sort()
    p50 = statistics.median(times) * 1000
    p95 = times[int(0.95 * len(times)) - 1] * 1000
    print(
        f"   explain on {N_REQUESTS:,} requests: p50 {p50:.1f} ms, p95 {p95:.1f} ms "
        f"over {SAMPLES} random ids (goal p95 <= 100 ms)"
    )
    store.close()
    return {"p50_ms": p50, "p95_ms": p95}


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
