"""Benchmark: diagnose one hour of 8 replicas (1 s engine and GPU samples, 1 M requests).

The store is synthetic and built set-wise with DuckDB ``range()`` (seconds, not minutes):
a steady fleet with one incident so the rules have work to do: from minute 30, pod-3's
queue time grows (queue_saturation) and its GPU reports XID 79 (gpu_xid). Reports the
median of ``--repeat`` runs of :func:`slokit.analysis.diagnose.diagnose`; the target is
<= 2 s.

    .venv/bin/python benchmarks/diagnose_scale.py [--requests 1000000] [--replicas 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from slokit.analysis.diagnose import diagnose
from slokit.store.db import Store, open_store

T0 = 1_795_958_000.0


def build(store: Store, *, replicas: int, seconds: int, n_requests: int) -> None:
    con = store.con
    half = seconds // 2
    con.execute(
        """
        INSERT INTO engine_samples (ts, replica, model, running, waiting, kv_usage_ratio,
            preemptions_total, prompt_tokens_total, generation_tokens_total,
            prefix_cache_queries_total, prefix_cache_hits_total, request_success_total,
            request_success_by_reason)
        SELECT to_timestamp($t0 + s), 'pod-' || r, 'm',
               8 + (s % 7), CASE WHEN r = 3 AND s >= $half THEN 30 ELSE s % 2 END,
               0.4 + 0.1 * sin(s / 60.0), 0, s * 400.0, s * 200.0, s * 400.0, s * 240.0,
               s * 2.0, MAP {'stop': s * 2.0}
        FROM range($replicas) a(r), range($seconds) b(s)
        """,
        {"t0": T0, "half": half, "replicas": replicas, "seconds": seconds},
    )
    con.execute(
        """
        INSERT INTO gpu_samples (ts, node, gpu, replica, util_ratio, sm_clock_mhz, power_w,
            temperature_c, xid_last, source)
        SELECT to_timestamp($t0 + s), 'node-' || r, '0', 'pod-' || r, 0.8, 1980, 550, 60,
               CASE WHEN r = 3 AND s >= $half THEN 79 ELSE 0 END, 'dcgm'
        FROM range($replicas) a(r), range($seconds) b(s)
        """,
        {"t0": T0, "half": half, "replicas": replicas, "seconds": seconds},
    )
    con.execute(
        """
        INSERT INTO requests (request_id, replica, model, arrival_ts, first_token_ts, finish_ts,
            ttft_s, queue_s, prefill_s, decode_s, e2e_s, tpot_s, prompt_tokens, output_tokens,
            status, http_status, sources, updated_at)
        SELECT 'req-' || i, 'pod-' || (i % $replicas), 'm', to_timestamp(a),
               to_timestamp(a + q + p), to_timestamp(a + q + p + d), q + p, q, p, d, q + p + d,
               d / 99, 200 + (i % 300), 100, 'ok', 200, ['vllm'], to_timestamp(a)
        FROM (
            SELECT i, $t0 + i * $seconds / $n AS a,
                   CASE WHEN i % $replicas = 3 AND i * $seconds / $n >= $half
                        THEN 1.5 ELSE 0.02 + (hash(i) % 100) / 5000.0 END AS q,
                   0.05 + (hash(i * 7) % 100) / 2000.0 AS p,
                   2.0 + (hash(i * 13) % 100) / 100.0 AS d
            FROM range($n) t(i)
        )
        """,
        {"t0": T0, "half": half, "replicas": replicas, "seconds": seconds, "n": n_requests},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--window",
        type=float,
        action="append",
        default=[],
        help="also diagnose only the newest this many seconds, timed in the same run "
        "(repeatable; e.g. 900 and 7200: the sidecar's tick, and its window held by a "
        "2-hour incident)",
    )
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    with open_store(":memory:") as store:
        t = time.perf_counter()
        build(store, replicas=args.replicas, seconds=args.seconds, n_requests=args.requests)
        build_s = time.perf_counter() - t
        times, doc = [], {}
        windows: dict[float, list[float]] = {w: [] for w in args.window}
        newest = store.reader().bounds()[1]
        assert newest is not None
        for _ in range(args.repeat):  # taking turns: the same machine state for each
            t = time.perf_counter()
            doc = diagnose(store.reader())
            times.append(time.perf_counter() - t)
            for w, took in windows.items():
                t = time.perf_counter()
                diagnose(store.reader(), since=newest - w)
                took.append(time.perf_counter() - t)
    result = {
        "benchmark": "diagnose_scale",
        "replicas": args.replicas,
        "seconds": args.seconds,
        "requests": args.requests,
        "build_s": round(build_s, 3),
        "diagnose_s": [round(x, 3) for x in times],
        "median_s": round(statistics.median(times), 3),
        "target_s": 2.0,
        "findings": sorted({(f["rule"], f["replica"]) for f in doc["findings"]}),
        "window_median_s": {str(w): round(statistics.median(x), 3) for w, x in windows.items()},
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"diagnose {args.replicas} replicas x {args.seconds} s, {args.requests:,} requests: "
            f"median {result['median_s']:.3f} s of {result['diagnose_s']} "
            f"(target <= 2 s; store built in {build_s:.1f} s)"
        )
        for w, took in result["window_median_s"].items():
            print(f"  the newest {float(w):g} s only: median {took:.3f} s")
        for rule, replica in result["findings"]:
            print(f"  found {rule} on {replica or 'fleet'}")


if __name__ == "__main__":
    main()
