"""The sidecar's SLI tick on a file that has been up for hours: ms per tick.

Each tick reads the requests whose first fragment arrived since the last (5 s, the default
``sli_interval_s``; :func:`slokit.store.queries.first_seen_between`). A DuckDB file is filled with ``--rate``
requests/s (a vLLM fragment, then a client fragment one second later, in ingestion order, as
the sidecar writes them) up to each of ``--hours``; at each size, the median CPU and wall time
of one tick over the newest windows, against the baseline measured on the same file in the
same run: the semi-join over the fragments the tick used before (every fragment of the
last 6 h read), which gives the same requests.

    python benchmarks/sli_tick.py [--rate 200] [--hours 0.25,1,3] [--repeats 15]

Goal: a tick's cost flat in the file's age (it follows the window's requests), and well
under 1% of a core at the default 5 s interval.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import duckdb

from slokit.store.db import open_store
from slokit.store.queries import _RECORD_COLUMNS, first_seen_between

T0 = 1_795_958_000.0

_BASELINE_SQL = f"""
WITH recent AS (
    SELECT DISTINCT request_id FROM request_fragments
    WHERE ingested_at > to_timestamp($lo) AND ingested_at <= to_timestamp($hi)
), first_seen AS (
    SELECT request_id FROM request_fragments
    WHERE ingested_at > to_timestamp($horizon) AND request_id IN (SELECT request_id FROM recent)
    GROUP BY request_id HAVING min(ingested_at) > to_timestamp($lo)
)
SELECT {", ".join(_RECORD_COLUMNS)} FROM requests
WHERE request_id IN (SELECT request_id FROM first_seen)
"""


def _fill(con: duckdb.DuckDBPyConnection, first: int, last: int, rate: float) -> None:
    """Requests ``first`` .. ``last - 1``: fragments in ingestion order, then their merged rows
    (first seen at their vLLM fragment's ingestion)."""
    step = 1.0 / rate
    for lo in range(first, last, 200_000):  # bounded batches: the ART index grows with them
        hi = min(last, lo + 200_000)
        con.execute(
            f"""
            INSERT INTO request_fragments (fragment_id, request_id, source, ingested_at,
                replica, arrival_ts, ttft_s, e2e_s, output_tokens, status)
            SELECT src || ':' || i, 'req-' || i, src,
                   to_timestamp({T0} + i * {step} + CASE src WHEN 'client' THEN 1.0 ELSE 0 END),
                   'pod-a', to_timestamp({T0} + i * {step}), 0.1, 1.0, 100, 'ok'
            FROM range({lo}, {hi}) r(i), (VALUES ('vllm'), ('client')) s(src)
            ORDER BY 4
            """
        ).fetchall()
        con.execute(
            f"""
            INSERT INTO requests (request_id, replica, arrival_ts, ttft_s, e2e_s,
                output_tokens, status, sources, updated_at, first_ingested_at)
            SELECT 'req-' || i, 'pod-a', to_timestamp({T0} + i * {step}), 0.1, 1.0, 100, 'ok',
                   ['vllm', 'client'], now(), to_timestamp({T0} + i * {step})
            FROM range({lo}, {hi}) r(i)
            """
        ).fetchall()


def _tick(cur: duckdb.DuckDBPyConnection, window: float, end: float) -> int:
    return len(first_seen_between(cur, end - window, end))


def _baseline(cur: duckdb.DuckDBPyConnection, window: float, end: float) -> int:
    lo = end - window
    params = {"lo": lo, "hi": end, "horizon": lo - 6 * 3600.0}
    return len(cur.execute(_BASELINE_SQL, params).fetchall())


def _median_ms(fn: Callable[[float], int], ends: list[float]) -> tuple[float, float, int]:
    wall, cpu, n = [], [], 0
    for end in ends:
        t, c = time.perf_counter(), time.process_time()
        n = fn(end)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
    return statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0, help="requests/s")
    ap.add_argument("--hours", default="0.25,1,3", help="file ages to measure at")
    ap.add_argument("--window", type=float, default=5.0, help="s per tick (sli_interval_s)")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "sli.duckdb")
        store.con.execute("SET threads = 1").fetchall()
        filled = 0
        print(f"{'hours':>6} {'fragments':>10} {'tick ms cpu':>12} {'baseline ms cpu':>16} "
              f"{'ratio':>6}  (wall: tick / baseline; requests per tick)")  # fmt: skip
        for hours in (float(h) for h in args.hours.split(",")):
            upto = int(hours * 3600 * args.rate)
            _fill(store.con, filled, upto, args.rate)
            store.con.execute("CHECKPOINT").fetchall()
            filled = upto
            newest = T0 + upto / args.rate
            # the newest seconds whose requests' client fragments are in (1 s after vLLM's)
            ends = [newest - 2.0 - k * args.window for k in range(args.repeats)]
            cur = store.cursor()
            tick = partial(_tick, cur, args.window)
            baseline = partial(_baseline, cur, args.window)
            tick(ends[0]), baseline(ends[0])  # warm both (caches, plans)
            t_cpu, t_wall, n = _median_ms(tick, ends)
            b_cpu, b_wall, nb = _median_ms(baseline, ends)
            assert n == nb, f"the tick found {n} requests, the baseline {nb}"
            frags = 2 * upto
            print(f"{hours:>6} {frags:>10} {t_cpu:>12.2f} {b_cpu:>16.2f} {b_cpu / t_cpu:>5.1f}x"
                  f"  ({t_wall:.2f} / {b_wall:.2f} ms; {n})")  # fmt: skip
            cur.close()
        store.close()


if __name__ == "__main__":
    main()
