"""OTLP llm_request spans -> records in a DuckDB file, spans/s on one core.

Bodies are ExportTraceServiceRequests of 512 spans (the OpenTelemetry SDK's default export batch,
what vLLM sends). The baseline, measured in the same run, is protobuf decoding alone
(``ParseFromString``); the full path is decode -> fragments -> batched Arrow append -> merge into
``requests`` in a DuckDB file, with DuckDB limited to one thread and the process pinned to one core.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from _synth import llm_request_export
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from slokit.sources.otlp import decode_traces
from slokit.store.db import open_store

SPANS_PER_BODY = 512
BODIES = 120  # 61,440 spans per run
BATCH_BODIES = 10  # the writer commits ~5,000 spans per transaction
REPEATS = 3


def _pin_one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def run_decode_only(bodies: list[bytes]) -> float:
    t = time.perf_counter()
    for b in bodies:
        ExportTraceServiceRequest().ParseFromString(b)
    return len(bodies) * SPANS_PER_BODY / (time.perf_counter() - t)


def run_full(bodies: list[bytes], path: Path) -> float:
    store = open_store(path)
    store.con.execute("SET threads = 1")
    t = time.perf_counter()
    batch = []
    for i, b in enumerate(bodies, 1):
        batch.extend(decode_traces(b).fragments)
        if i % BATCH_BODIES == 0:
            store.append_fragments(batch)
            batch = []
    if batch:
        store.append_fragments(batch)
    store.con.execute("CHECKPOINT")
    rate = len(bodies) * SPANS_PER_BODY / (time.perf_counter() - t)
    n = store.con.execute("SELECT count(*) FROM requests").fetchone()
    store.close()
    assert n == (len(bodies) * SPANS_PER_BODY,), n
    return rate


def main(argv: list[str]) -> dict[str, float]:
    _pin_one_core()
    bodies = [
        llm_request_export(SPANS_PER_BODY, start_index=i * SPANS_PER_BODY) for i in range(BODIES)
    ]
    decode, full = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(REPEATS):
            decode.append(run_decode_only(bodies))
            full.append(run_full(bodies, Path(tmp) / f"bench{r}.duckdb"))
    d, f = statistics.median(decode), statistics.median(full)
    print(f"   protobuf decode only : {d:12,.0f} spans/s (median of {REPEATS})")
    print(f"   spans -> DuckDB file : {f:12,.0f} spans/s (median of {REPEATS}; goal >= 20,000)")
    print(f"   full / decode-only   : {f / d:12.3f}")
    return {"decode_spans_per_s": d, "ingest_spans_per_s": f, "ratio": f / d}


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
